// Token data for pretraining: shards in the modded-nanogpt format (a 256 x int32 header: magic
// 20240520, version 1, token count; then uint16 tokens, little-endian), a directory of them
// (train_*.bin, val_*.bin, data.json naming the document separator), and a loader that builds
// packed batches starting on document starts (the seed's Shard.next_batch): documents are cut to
// max_seq_len tokens, each piece is an attention segment.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "train/gpt_step.h"

namespace deg::train {

inline constexpr int32_t kShardMagic = 20240520;

void shard_write(const std::filesystem::path& path, const std::vector<uint16_t>& tokens);
// Throws deg::Error (format) naming the file when the header or the size is wrong.
std::vector<uint16_t> shard_read(const std::filesystem::path& path);

// DIR/data.json: {"bos_id": N, "vocab_size": V}.
struct DataInfo {
  int32_t bos_id = 0;
  int64_t vocab_size = 0;
};
DataInfo data_info_read(const std::filesystem::path& dir);
void data_info_write(const std::filesystem::path& dir, const DataInfo& info);
// Sorted DIR/<prefix>_*.bin.
std::vector<std::filesystem::path> shard_files(const std::filesystem::path& dir,
                                               const std::string& prefix);

// Deterministic batches from a list of shards; wraps around at the end.
class ShardLoader {
 public:
  ShardLoader(std::vector<std::filesystem::path> files, int32_t bos_id);

  // T input tokens (T + 1 read: targets are the inputs shifted by one), starting on a document
  // start; documents longer than max_seq_len are cut there.
  GptBatch next(int64_t T, int64_t max_seq_len);

  struct Position {
    int64_t shard = 0, doc = 0, epoch = 0;
  };
  Position position() const { return pos_; }
  void seek(Position p);
  int64_t tokens_in_shard() const { return int64_t(tokens_.size()); }

 private:
  void load(int64_t shard);
  std::vector<std::filesystem::path> files_;
  int32_t bos_;
  std::vector<uint16_t> tokens_;
  std::vector<int64_t> starts_;  // document starts (bos positions) of the loaded shard
  int64_t loaded_ = -1;
  Position pos_;
};

}  // namespace deg::train
