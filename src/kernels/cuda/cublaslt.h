// cuBLASLt's entry points, taken from the shared library the first time a CUDA backend is made
// (dlopen), not linked: a linked libcublasLt runs its initialisers in every process before main —
// 0.3 s and 220 MB for `deg` on a CPU and for each test binary run, GPU or not (docs/cuda.md).
#pragma once

#include <cublasLt.h>

#include <string>

namespace deg::cuda {

// The entry points deg calls, each as X(name) for cublasLt<name>: the struct's members, what
// open_cublaslt takes from the library and what the tests check come from this one list.
#define DEG_CUBLASLT_ENTRY_POINTS(X) \
  X(Create)                          \
  X(Matmul)                          \
  X(MatmulAlgoCheck)                 \
  X(MatmulAlgoGetHeuristic)          \
  X(MatmulDescCreate)                \
  X(MatmulDescDestroy)               \
  X(MatmulDescSetAttribute)          \
  X(MatmulPreferenceCreate)          \
  X(MatmulPreferenceDestroy)         \
  X(MatmulPreferenceSetAttribute)    \
  X(MatrixLayoutCreate)              \
  X(MatrixLayoutDestroy)             \
  X(MatrixLayoutSetAttribute)

struct CublasLt {
#define DEG_CUBLASLT_MEMBER(name) decltype(&::cublasLt##name) name = nullptr;
  DEG_CUBLASLT_ENTRY_POINTS(DEG_CUBLASLT_MEMBER)
#undef DEG_CUBLASLT_MEMBER
};

// Opens `library` (a path or a file name for the loader's search) and takes every entry point;
// empty: the library of the headers' major version (libcublasLt.so.13 for CUDA 13) by the
// loader's search, then in the toolkit's library folder of the build. Throws deg::Error
// (unsupported) naming the library when it cannot be opened or lacks an entry point.
CublasLt open_cublaslt(const std::string& library);

// open_cublaslt($DEG_CUBLASLT, or empty when unset), once for the process (a failure is thrown
// again at the next call).
const CublasLt& cublaslt();

}  // namespace deg::cuda
