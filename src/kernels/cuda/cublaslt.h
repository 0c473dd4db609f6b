// cuBLASLt's entry points, taken from the shared library the first time a CUDA backend is made
// (dlopen), not linked: a linked libcublasLt runs its initialisers in every process before main —
// 0.3 s and 220 MB for `deg` on a CPU and for each test binary run, GPU or not (docs/cuda.md).
#pragma once

#include <cublasLt.h>

namespace deg::cuda {

struct CublasLt {
  decltype(&::cublasLtCreate) Create;
  decltype(&::cublasLtMatmul) Matmul;
  decltype(&::cublasLtMatmulAlgoCheck) MatmulAlgoCheck;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
};

// The library of the headers' major version (libcublasLt.so.13 for CUDA 13), by the loader's
// search and then in the toolkit's library folder of the build; opened once. Throws deg::Error
// (unsupported) naming the library when it cannot be opened or lacks an entry point.
const CublasLt& cublaslt();

}  // namespace deg::cuda
