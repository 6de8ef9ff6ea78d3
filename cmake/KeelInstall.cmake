# `cmake --install build --prefix P`: the library, its public headers, the keel binary and a CMake
# package (KeelConfig.cmake, KeelConfigVersion.cmake, KeelTargets.cmake exporting keel::keel)
# under P; `cpack -G DEB` in the build folder packs the same files as a .deb.
include(CMakePackageConfigHelpers)

set(KEEL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Keel)

install(TARGETS keel EXPORT KeelTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET keel_cli)
  install(TARGETS keel_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
# libkeel_cuda beside libkeel, where libkeel looks for it (framework/runtime/cuda_backend.h); not
# exported: programs link libkeel alone and the CUDA backend is opened at run time.
if(TARGET keel_cuda)
  install(TARGETS keel_cuda LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()

# Headers keep their source layout under include/keel, so "framework/ir/program.h" and
# <keel/keel.h> both resolve (keel::keel adds include/ and include/keel).
install(FILES include/keel/keel.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/keel)
install(DIRECTORY framework executor fleet transpiler ops models trainer
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/keel
        FILES_MATCHING PATTERN "*.h")
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR} OPTIONAL)

install(EXPORT KeelTargets NAMESPACE keel:: DESTINATION ${KEEL_CMAKE_DIR})
configure_package_config_file(cmake/KeelConfig.cmake.in
  ${PROJECT_BINARY_DIR}/KeelConfig.cmake
  INSTALL_DESTINATION ${KEEL_CMAKE_DIR}
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_BINDIR)
# 0.x: a minor release may change the API, so 0.2 accepts 0.2.* only.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/KeelConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/KeelConfig.cmake ${PROJECT_BINARY_DIR}/KeelConfigVersion.cmake
        DESTINATION ${KEEL_CMAKE_DIR})

# The library's dependencies as Debian packages: shared libraries through dpkg-shlibdeps, the
# development packages that KeelConfig.cmake's find_dependency calls need by name.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME keel)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "keel developers <keel@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "C++ training framework for data-parallel deep learning (library, headers, keel tool)")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libgflags-dev, libgoogle-glog-dev")
if(KEEL_NATIVE)
  message(STATUS "keel: KEEL_NATIVE=ON compiles for this CPU only; configure with "
                 "-DKEEL_NATIVE=OFF before `cpack` to make a .deb for other machines")
endif()
include(CPack)
