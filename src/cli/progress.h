// Pieces of the progress lines long commands (`deg pretrain`, `deg tokenizer train`) draw on
// stderr: a bar and a clock.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>

namespace deg::cli {

// "[#########.....................]": `done` of `total` as a bar of `width` cells.
inline std::string progress_bar(int64_t done, int64_t total, int width = 30) {
  const int filled =
      int(int64_t(width) * std::clamp<int64_t>(done, 0, total) / std::max<int64_t>(1, total));
  std::string bar(size_t(filled), '#');
  bar.resize(size_t(width), '.');
  return "[" + bar + "]";
}

// Seconds as m:ss, or h:mm:ss from an hour on.
inline std::string progress_clock(double seconds) {
  const auto t = int64_t(std::max(0.0, seconds) + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{}:{:02}", t / 60, t % 60);
}

}  // namespace deg::cli
