// Rotary position embedding as HF Qwen3.5 computes it for text: the first `rot` dims of each head
// rotate (rotate_half pairing i with i + rot/2), the rest pass through. Frequencies and angles
// are computed in f32 exactly as HF does (inv_freq = 1 / theta^(2i/rot), angle = pos * inv_freq
// in f32), so only cos/sin rounding differs. Text positions are equal on the T/H/W axes of HF's
// multimodal rope, which makes its section recomposition the identity: plain 1-D rope.
#pragma once

#include <cstdint>
#include <vector>

namespace deg {

struct RopeTable {
  int64_t rot = 0;              // rotary dims per head (even)
  std::vector<float> inv_freq;  // [rot / 2]
};

RopeTable rope_table(int64_t head_dim, double partial_factor, double theta);

// Rotates `heads` vectors of one token at position pos, in place: x[h * stride + i].
void rope_apply(const RopeTable& table, int64_t pos, float* x, int64_t heads, int64_t stride);

}  // namespace deg
