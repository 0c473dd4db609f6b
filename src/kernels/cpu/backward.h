// The CPU backend's training kernels (kernels/cpu/backward.cc): the backward ops and the
// optimizer steps, each over the index range a thread of the backend's parallel loop is given
// (rows, vectors, table rows, elements or head tasks).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/ops.h"

namespace deg {

void matmul_range(const MatmulOpArgs& a, int64_t i0, int64_t i1);  // rows of c
// With bf16_all precision: a and b rounded into ra and rb (packed) and the args over them at
// exact precision; otherwise a as it is.
MatmulOpArgs rounded_operands(const MatmulOpArgs& a, std::vector<float>& ra,
                              std::vector<float>& rb);
void rms_norm_backward_range(const NormBackwardArgs& a, int64_t v0, int64_t v1);  // vectors
void activation_backward_range(const ActivationBackwardArgs& a, int64_t r0, int64_t r1);
void column_sum_range(const ColumnSumArgs& a, int64_t j0, int64_t j1);  // columns
void combine_backward_range(const CombineBackwardArgs& a, int64_t r0, int64_t r1);

// Positions i of `ids` (n of them) grouped by table row (of `rows`), each row's in increasing
// order: row v's are order[starts[v] .. starts[v + 1]). Ids outside [0, rows) are left out.
std::vector<int64_t> gather_order(const int32_t* ids, int64_t n, int64_t rows,
                                  std::vector<int64_t>& starts);
void gather_backward_rows(const GatherBackwardArgs& a, const std::vector<int64_t>& order,
                          const std::vector<int64_t>& starts, int64_t v0, int64_t v1);
void gather_row_scale_range(const GatherBackwardArgs& a, const int32_t* ids, int64_t i0,
                            int64_t i1);

// dz [rows, heads] and the input gradients over rows; then the weight gradients over (head,
// input column) pairs.
void sigmoid_gates_dz_range(const SigmoidGatesBackwardArgs& a, float* dz, int64_t r0, int64_t r1);
void sigmoid_gates_dw_range(const SigmoidGatesBackwardArgs& a, const float* dz, int64_t e0,
                            int64_t e1);
void subtract_projection_backward_range(const ProjectionBackwardArgs& a, int64_t i0, int64_t i1);

// The hashed rows and sign rows of token i (NgramEmbedArgs' hashes).
void ngram_rows_of(const NgramEmbedArgs& a, int64_t i, int32_t rows[2], int32_t signs[2]);
// Entries 2 i + channel of the n tokens grouped by table row (see gather_order); signs [2 n].
std::vector<int64_t> ngram_order(const NgramEmbedArgs& a, int64_t n, std::vector<int64_t>& starts,
                                 std::vector<int32_t>& signs);
void ngram_backward_rows(const NgramBackwardArgs& a, const std::vector<int64_t>& order,
                         const std::vector<int64_t>& starts, const std::vector<int32_t>& signs,
                         int64_t v0, int64_t v1);

void adam_step_range(const AdamStepArgs& a, int64_t i0, int64_t i1);
void nesterov_range(const NesterovArgs& a, int64_t i0, int64_t i1);
// sum_squares sums kSumChunk elements at a time in f64, then the chunks in order (the CUDA
// backend the same), so the result depends on n only.
inline constexpr int64_t kSumChunk = 4096;
double sum_squares_chunk(const float* x, int64_t n, int64_t chunk);
void normuon_step(const NorMuonStepArgs& a);  // one block (u, p, second; count ignored), one thread

}  // namespace deg
