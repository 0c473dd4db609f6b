// What the GEMM probes (mma_bits_probe.cu, small_gemm_probe.cu) share: CK, and cuBLASLt's
// descriptors of y [M, N] (f32, row stride N) = x [M, K] (bf16) w [N, K]^T (bf16), f32
// accumulation, no workspace (as the backend's pinned products).
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                     \
  do {                                                            \
    auto e_ = (x);                                                \
    if (e_ != 0) {                                                \
      printf("error %d at %s:%d\n", int(e_), __FILE__, __LINE__); \
      exit(1);                                                    \
    }                                                             \
  } while (0)

struct LtProduct {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t w, x, y;   // cuBLASLt's A (w as [K, N] column-major), B, D
  cublasLtMatmulPreference_t pref;  // no workspace
};

inline LtProduct lt_product(int M, int N, int K) {
  LtProduct p{};
  CK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  CK(cublasLtMatrixLayoutCreate(&p.w, CUDA_R_16BF, K, N, K));
  CK(cublasLtMatrixLayoutCreate(&p.x, CUDA_R_16BF, K, M, K));
  CK(cublasLtMatrixLayoutCreate(&p.y, CUDA_R_32F, N, M, N));
  CK(cublasLtMatmulPreferenceCreate(&p.pref));
  const uint64_t none = 0;
  CK(cublasLtMatmulPreferenceSetAttribute(p.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &none,
                                          sizeof(none)));
  return p;
}
