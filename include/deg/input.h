// Reading documents from outside — files, JSON Lines, documents in parts — within deg's input
// limits (docs/hardening.md). The CLI and the server read documents only through these doors:
// sizes are checked before anything is read whole, file parts come only from a directory the
// user named, and binary input is refused rather than read.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deg {

struct DocumentPart;
using DocumentParts = std::vector<DocumentPart>;

struct InputLimits {
  int64_t document_bytes = int64_t(8) << 20;  // 8 MiB (8,388,608): a document's text parts
  int64_t line_bytes = int64_t(32) << 20;     // 32 MiB (33,554,432): one JSON Lines line
  int64_t parts = 4096;                       // parts of one document
  int64_t media_bytes = int64_t(1) << 30;     // 1 GiB: one media part's .npy file
};

// Where file parts ({"text_file": F}, {"image": F.npy}, {"audio": F.npy}) may come from:
// relative names are resolved against `base`; the file, with its symlinks and ".." resolved,
// must lie under `root` (resolved too). An empty `root` refuses every file part.
struct PartsAccess {
  std::filesystem::path base;
  std::filesystem::path root;
};

// A document file's text. Throws deg::Error: a directory, a missing file, a file over
// limits.document_bytes (a regular file by its size, before it is read; a pipe or a device
// after document_bytes + 1 bytes), or text holding NUL bytes (a binary file).
std::string document_read(const std::filesystem::path& path, const InputLimits& limits = {});

// A document given as JSON: a string, {"document": "..."} or {"parts": [{"text": ...},
// {"text_file": F}, {"image": F.npy}, {"audio": F.npy}, ...]}. Throws deg::Error naming
// `where` (and the part at fault) for anything else, a file part `access` refuses, or a
// document over `limits`.
DocumentParts document_from_json(const nlohmann::json& j, const PartsAccess& access,
                                 const InputLimits& limits, const std::string& where);
// The same for one line of JSON text (parsed with deg's JSON limits).
DocumentParts document_from_line(std::string_view line, const PartsAccess& access,
                                 const InputLimits& limits, const std::string& where);

// The lines of a file descriptor as they arrive (JSON Lines input: `deg fill --jsonl` on
// stdin, `deg eval --data`). Memory stays within one line: a line over `max_line_bytes`
// comes back as an error and the rest of it is skipped unread into memory.
class LineReader {
 public:
  struct Line {
    int64_t number = 0;  // 1-based
    std::string text;    // without the newline (and a trailing '\r')
    std::string error;   // non-empty: this line could not be read (text is empty)
  };

  LineReader(int fd, int64_t max_line_bytes);
  // The next line, or nullopt at the end of the input. A NUL byte means binary input: that line
  // comes back as an error and nothing after it is read. Throws deg::Error when read(2) fails.
  std::optional<Line> next();
  // A next line (or the end) is there without waiting for more input.
  bool ready();

 private:
  bool fill();  // reads more; false at the end of the input

  int fd_;
  int64_t max_;
  std::string buffer_;
  size_t begin_ = 0;  // start of the unread part of buffer_
  int64_t number_ = 0;
  bool eof_ = false;
  bool stopped_ = false;
};

}  // namespace deg
