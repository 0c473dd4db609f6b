// Shard files and the document-aligned batch loader (see data.h).
#include "train/data.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "io/json.h"

namespace deg::train {
namespace fs = std::filesystem;

void shard_write(const fs::path& path, const std::vector<uint16_t>& tokens) {
  std::vector<int32_t> header(256, 0);
  header[0] = kShardMagic;
  header[1] = 1;
  header[2] = int32_t(tokens.size());
  if (tokens.size() > size_t(INT32_MAX))
    throw Error(ErrorKind::invalid_argument, "too many tokens for one shard", {path.string()});
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 256 * 4);
  out.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 2));
  if (!out) throw Error(ErrorKind::io, "cannot write the shard", {path.string()});
}

std::vector<uint16_t> shard_read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::not_found, "cannot open the shard", {path.string()});
  std::vector<int32_t> header(256);
  in.read(reinterpret_cast<char*>(header.data()), 256 * 4);
  if (in.gcount() != 256 * 4)
    throw Error(ErrorKind::format, "shard shorter than its 1024-byte header", {path.string()});
  if (header[0] != kShardMagic)
    throw Error(ErrorKind::format,
                fmt::format("magic number {} is not {} (not a modded-nanogpt token shard)",
                            header[0], kShardMagic),
                {path.string()});
  if (header[1] != 1)
    throw Error(ErrorKind::format, fmt::format("unsupported shard version {}", header[1]),
                {path.string()});
  if (header[2] < 0) throw Error(ErrorKind::format, "negative token count", {path.string()});
  if (fs::file_size(path) < 1024 + 2 * uint64_t(header[2]))
    throw Error(ErrorKind::format,
                fmt::format("header claims {} tokens, the file holds fewer", header[2]),
                {path.string()});
  std::vector<uint16_t> tokens(static_cast<size_t>(header[2]));
  in.read(reinterpret_cast<char*>(tokens.data()), std::streamsize(tokens.size() * 2));
  if (size_t(in.gcount()) != tokens.size() * 2)
    throw Error(ErrorKind::format,
                fmt::format("header claims {} tokens, the file holds fewer", header[2]),
                {path.string()});
  return tokens;
}

DataInfo data_info_read(const fs::path& dir) {
  const fs::path p = dir / "data.json";
  if (!fs::exists(p))
    throw Error(ErrorKind::not_found,
                "data.json not found; make the data directory with `deg shard`, or write "
                "{\"bos_id\": N, \"vocab_size\": V} there",
                {p.string()});
  const Json j = json_load(p);
  DataInfo d;
  d.bos_id = j.value("bos_id", 0);
  d.vocab_size = j.value("vocab_size", int64_t(0));
  return d;
}

void data_info_write(const fs::path& dir, const DataInfo& info) {
  std::ofstream out(dir / "data.json");
  out << Json{{"bos_id", info.bos_id}, {"vocab_size", info.vocab_size}}.dump(2) << "\n";
  if (!out) throw Error(ErrorKind::io, "cannot write data.json", {dir.string()});
}

std::vector<fs::path> shard_files(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> out;
  if (!fs::is_directory(dir))
    throw Error(ErrorKind::not_found, "data directory not found", {dir.string()});
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix + "_", 0) == 0 && e.path().extension() == ".bin") out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

ShardLoader::ShardLoader(std::vector<fs::path> files, int32_t bos_id)
    : files_(std::move(files)), bos_(bos_id) {
  if (files_.empty()) throw Error(ErrorKind::not_found, "no token shards to read");
}

void ShardLoader::load(int64_t shard) {
  if (shard == loaded_) return;
  tokens_ = shard_read(files_[size_t(shard)]);
  starts_.clear();
  for (size_t i = 0; i < tokens_.size(); ++i)
    if (tokens_[i] == bos_) starts_.push_back(int64_t(i));
  if (starts_.empty())
    throw Error(ErrorKind::format, fmt::format("no document start (token {}) in the shard", bos_),
                {files_[size_t(shard)].string()});
  loaded_ = shard;
}

void ShardLoader::seek(Position p) {
  pos_ = p;
  load(pos_.shard);
}

GptBatch ShardLoader::next(int64_t T, int64_t max_seq_len) {
  std::vector<int32_t> buf;
  std::vector<int32_t> seg;
  buf.reserve(size_t(T + 1));
  load(pos_.shard);
  while (int64_t(buf.size()) < T + 1) {
    if (pos_.doc >= int64_t(starts_.size())) {
      pos_.doc = 0;
      if (++pos_.shard >= int64_t(files_.size())) {
        pos_.shard = 0;
        ++pos_.epoch;
      }
      load(pos_.shard);
    }
    const int64_t cur = starts_[size_t(pos_.doc)];
    const int64_t doc_end = pos_.doc + 1 < int64_t(starts_.size()) ? starts_[size_t(pos_.doc + 1)]
                                                                   : int64_t(tokens_.size());
    ++pos_.doc;
    const int64_t end = std::min({doc_end, cur + max_seq_len, cur + T + 1 - int64_t(buf.size())});
    const int32_t start = int32_t(buf.size());
    for (int64_t i = cur; i < end; ++i) {
      buf.push_back(tokens_[size_t(i)]);
      seg.push_back(start);
    }
  }
  GptBatch b;
  b.inputs.assign(buf.begin(), buf.end() - 1);
  b.targets.assign(buf.begin() + 1, buf.end());
  b.seg_start.assign(seg.begin(), seg.end() - 1);
  return b;
}

}  // namespace deg::train
