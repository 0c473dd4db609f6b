#include "kernels/cuda/cublaslt.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <string>
#include <type_traits>

#include "core/error.h"

namespace deg::cuda {

CublasLt open_cublaslt(const std::string& library) {
  const std::string soname = fmt::format("libcublasLt.so.{}", CUBLAS_VER_MAJOR);
  const std::string& name = library.empty() ? soname : library;
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
#ifdef DEG_CUBLASLT_DIR
  if (!lib && library.empty()) {
    const std::string path = fmt::format("{}/{}", DEG_CUBLASLT_DIR, soname);
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
#endif
  if (!lib) {
    const char* why = dlerror();
    throw Error(ErrorKind::unsupported,
                fmt::format("the CUDA backend needs {} (cuBLASLt of CUDA {}): {}; put its folder "
                            "on LD_LIBRARY_PATH or name it in DEG_CUBLASLT, or use --device cpu",
                            name, CUBLAS_VER_MAJOR, why ? why : "not found"));
  }
  auto take = [&](auto& fn, const char* symbol) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
    if (fn) return;
    dlclose(lib);
    throw Error(ErrorKind::unsupported, fmt::format("{} has no {}", name, symbol));
  };
  CublasLt lt{};
#define DEG_CUBLASLT_TAKE(name) take(lt.name, "cublasLt" #name);
  DEG_CUBLASLT_ENTRY_POINTS(DEG_CUBLASLT_TAKE)
#undef DEG_CUBLASLT_TAKE
  return lt;  // the library stays open for the process
}

const CublasLt& cublaslt() {
  static const CublasLt lt = [] {
    const char* env = std::getenv("DEG_CUBLASLT");
    return open_cublaslt(env ? env : "");
  }();
  return lt;
}

}  // namespace deg::cuda
