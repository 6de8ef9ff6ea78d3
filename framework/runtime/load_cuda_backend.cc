#include "framework/runtime/cuda_backend.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "framework/error.h"

namespace keel {
namespace {

CudaBackend* g_backend = nullptr;  // set by RegisterCudaBackend while the library opens
std::string g_error;

// The folder libkeel was loaded from ("" when the loader does not say).
std::string OwnFolder() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&GetCudaBackend), &info) == 0 || info.dli_fname == nullptr)
    return "";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

void Open() {
  const char* env = std::getenv("KEEL_CUDA_LIBRARY");
  if (env != nullptr && std::string(env) == "none") {
    g_error = "KEEL_CUDA_LIBRARY=none turns CUDA off";
    return;
  }
  std::vector<std::string> candidates;
  if (env != nullptr && *env != '\0') {
    candidates.push_back(env);
  } else {
    const std::string name = std::string("libkeel_cuda.so.") + KEEL_VERSION_MAJOR_MINOR;
    const std::string folder = OwnFolder();
    if (!folder.empty()) candidates.push_back(folder + name);
    candidates.push_back(name);
  }
  std::string errors;
  for (const std::string& c : candidates) {
    // RTLD_GLOBAL: the kernels' vtables and the registrations resolve against libkeel, which is
    // loaded already; nothing else needs the library's symbols.
    if (dlopen(c.c_str(), RTLD_NOW | RTLD_GLOBAL) != nullptr) {
      if (g_backend != nullptr) return;
      g_error = c + " opened but registered no CUDA backend";
      return;
    }
    const char* e = dlerror();
    errors += (errors.empty() ? "" : "; ") + std::string(e ? e : c + ": cannot be opened");
  }
  g_error = "keel's CUDA backend could not be loaded (" + errors +
            "); install CUDA and libkeel_cuda, or set KEEL_CUDA_LIBRARY";
}

}  // namespace

void RegisterCudaBackend(CudaBackend* backend) { g_backend = backend; }

CudaBackend* GetCudaBackend() {
  static std::once_flag once;
  std::call_once(once, Open);
  return g_backend;
}

std::string CudaBackendError() { return GetCudaBackend() ? "" : g_error; }

CudaBackend& CudaBackendFor(const Place& place) {
  CudaBackend* b = GetCudaBackend();
  if (b == nullptr) KEEL_THROW(place.str(), ": ", g_error);
  return *b;
}

}  // namespace keel
