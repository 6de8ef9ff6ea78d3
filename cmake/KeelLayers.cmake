# keel's layers, which the build enforces.
#
# Each layer is a set of source paths (folders, single files, or file patterns such as
# ops/*.cu) and the layers it may use. It
# compiles as an OBJECT library whose include path is a *view*: a folder under
# build/layer_views/<layer>/ holding symbolic links to its own paths and to those of the layers it
# may use (transitively), and nothing else. An include of a layer above, or of one it does not
# declare, is then "No such file or directory" at compile time, not a review comment. The objects
# of every layer link into the one libkeel.
#
# The table is also written to build/keel_layers.md, and a test compares it with
# docs/architecture.md's table (tests/cmake/layers_doc_check.sh), so the doc cannot drift.

set(KEEL_LAYERS "")
set(KEEL_LAYER_TABLE "")

# keel_layer(NAME PATHS path... [USES layer...] [WHAT text])
function(keel_layer name)
  cmake_parse_arguments(L "" "WHAT" "PATHS;USES" ${ARGN})
  set(closure ${name})
  foreach(dep ${L_USES})
    if(NOT DEFINED KEEL_LAYER_${dep}_CLOSURE)
      message(FATAL_ERROR "keel layer ${name} uses ${dep}, which is not defined before it")
    endif()
    list(APPEND closure ${KEEL_LAYER_${dep}_CLOSURE})
  endforeach()
  list(REMOVE_DUPLICATES closure)
  set(KEEL_LAYER_${name}_CLOSURE ${closure} PARENT_SCOPE)
  set(KEEL_LAYER_${name}_PATHS ${L_PATHS} PARENT_SCOPE)
  set(KEEL_LAYER_${name}_USES ${L_USES} PARENT_SCOPE)
  set(layers ${KEEL_LAYERS})
  list(APPEND layers ${name})
  set(KEEL_LAYERS ${layers} PARENT_SCOPE)
  list(JOIN L_PATHS ", " paths)
  list(JOIN L_USES ", " uses)
  set(KEEL_LAYER_TABLE "${KEEL_LAYER_TABLE}| ${name} | ${paths} | ${uses} |\n" PARENT_SCOPE)
endfunction()

# The view of `layer`: links to the paths of every layer in its closure (patterns name files
# inside folders of the layers they extend, which the closure links). Returns its folder.
function(keel_layer_view layer out_var)
  set(view ${PROJECT_BINARY_DIR}/layer_views/${layer})
  file(REMOVE_RECURSE ${view})
  # Bottom-up, so that a folder is linked before a file inside it is considered (already
  # reachable then, it is skipped).
  foreach(l ${KEEL_LAYERS})
    if(NOT l IN_LIST KEEL_LAYER_${layer}_CLOSURE)
      continue()
    endif()
    foreach(p ${KEEL_LAYER_${l}_PATHS})
      if(NOT p MATCHES "[*]" AND EXISTS ${PROJECT_SOURCE_DIR}/${p} AND NOT EXISTS ${view}/${p})
        get_filename_component(parent ${view}/${p} DIRECTORY)
        file(MAKE_DIRECTORY ${parent})
        file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${p} ${view}/${p} SYMBOLIC)
      endif()
    endforeach()
  endforeach()
  set(${out_var} ${view} PARENT_SCOPE)
endfunction()

# The sources of `layer`: *.cc (and, with CUDA, *.cu) under its folders, and its single .cc
# files; `exclude_regex` drops matches (CUDA-only files in a CPU build, example programs).
function(keel_layer_sources layer exclude_regex out_var)
  set(srcs "")
  foreach(p ${KEEL_LAYER_${layer}_PATHS})
    set(abs ${PROJECT_SOURCE_DIR}/${p})
    if(p MATCHES "[*]")
      file(GLOB found CONFIGURE_DEPENDS ${abs})
      list(APPEND srcs ${found})
    elseif(IS_DIRECTORY ${abs})
      file(GLOB_RECURSE found CONFIGURE_DEPENDS ${abs}/*.cc ${abs}/*.cu)
      list(APPEND srcs ${found})
    elseif(p MATCHES "\\.(cc|cu)$")
      list(APPEND srcs ${abs})
    endif()
  endforeach()
  if(exclude_regex)
    list(FILTER srcs EXCLUDE REGEX "${exclude_regex}")
  endif()
  set(${out_var} ${srcs} PARENT_SCOPE)
endfunction()
