// Documents from outside (deg/input.h): files and JSON Lines read within the input limits, parts
// whose files must lie under the root the user named.
#include "deg/input.h"

#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/buffer.h"
#include "core/error.h"
#include "deg/engine.h"
#include "io/json.h"
#include "io/npy.h"

namespace deg {

namespace fs = std::filesystem;

namespace {

Error nul_error(const std::string& where, size_t at) {
  return Error(ErrorKind::format,
               fmt::format("holds a NUL byte (at byte {}): this is binary data, not text; convert "
                           "it to UTF-8 text first",
                           at),
               {.path = where});
}

Error too_long(const std::string& where, const char* what, int64_t bytes, int64_t limit) {
  return Error(ErrorKind::unsupported,
               fmt::format("{} has {} bytes of text, over the limit of {} bytes; split it, or "
                           "raise --max-document-bytes",
                           what, bytes, limit),
               {.path = where});
}

// `name` resolved for `access`: the canonical file, which must lie under the canonical root.
fs::path resolve_part_file(const std::string& name, const PartsAccess& access,
                           const std::string& where, size_t part) {
  if (access.root.empty()) {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("part {} names the file \"{}\", and file parts are refused here: pass "
                            "--parts-root DIR to allow files under DIR",
                            part, name),
                {.path = where});
  }
  std::error_code ec;
  const fs::path root = fs::canonical(access.root, ec);
  if (ec || !fs::is_directory(root)) {
    throw Error(ErrorKind::not_found, "the parts root is not a directory; pass an existing one",
                {.path = access.root.string()});
  }
  const fs::path file =
      fs::canonical(fs::path(name).is_absolute() ? fs::path(name) : access.base / name, ec);
  if (ec) {
    throw Error(ErrorKind::not_found,
                fmt::format("part {}: file \"{}\" not found ({})", part, name, ec.message()),
                {.path = where});
  }
  auto r = root.begin();
  auto f = file.begin();
  for (; r != root.end() && f != file.end() && *r == *f; ++r, ++f) {
  }
  if (r != root.end()) {
    throw Error(ErrorKind::invalid_argument,
                fmt::format("part {}: file \"{}\" lies outside the parts root {} (symlinks and .. "
                            "resolved); deg reads no file parts from elsewhere",
                            part, name, root.string()),
                {.path = where});
  }
  return file;
}

}  // namespace

std::string document_read(const fs::path& path, const InputLimits& limits) {
  std::string text = read_file(path, limits.document_bytes, "document");
  if (const size_t nul = text.find('\0'); nul != std::string::npos) {
    throw nul_error(path.string(), nul);
  }
  return text;
}

DocumentParts document_from_json(const Json& j, const PartsAccess& access,
                                 const InputLimits& limits, const std::string& where) {
  auto text_of = [&](const Json& s) {
    const auto& t = s.get_ref<const std::string&>();
    if (int64_t(t.size()) > limits.document_bytes)
      throw too_long(where, "the document", int64_t(t.size()), limits.document_bytes);
    return DocumentParts{DocumentPart::of_text(t)};
  };
  if (j.is_string()) return text_of(j);
  if (j.is_object() && j.contains("document") && j["document"].is_string()) {
    return text_of(j["document"]);
  }
  if (!j.is_object() || !j.contains("parts") || !j["parts"].is_array()) {
    throw Error(ErrorKind::format,
                "expected a JSON string, {\"document\": \"...\"} or a document in parts "
                "{\"parts\": [{\"text\": ...} | {\"text_file\": F} | {\"image\": F.npy} | "
                "{\"audio\": F.npy}, ...]}",
                {.path = where});
  }
  const Json& list = j["parts"];
  if (int64_t(list.size()) > limits.parts) {
    throw Error(
        ErrorKind::invalid_argument,
        fmt::format("the document has {} parts, over the limit of {}", list.size(), limits.parts),
        {.path = where});
  }
  DocumentParts parts;
  int64_t text_bytes = 0;
  auto add_text = [&](std::string text) {
    text_bytes += int64_t(text.size());
    if (text_bytes > limits.document_bytes)
      throw too_long(where, "the document", text_bytes, limits.document_bytes);
    parts.push_back(DocumentPart::of_text(std::move(text)));
  };
  for (const Json& p : list) {
    const size_t i = parts.size();
    const char* kind = nullptr;
    int kinds = 0;
    for (const char* k : {"text", "text_file", "image", "audio"}) {
      if (p.is_object() && p.contains(k)) {
        kind = k;
        ++kinds;
      }
    }
    if (kinds != 1) {
      throw Error(ErrorKind::format,
                  fmt::format("part {} must hold exactly one of text, text_file, image, audio", i),
                  {.path = where});
    }
    if (!p[kind].is_string()) {
      throw Error(ErrorKind::format, fmt::format("part {}: \"{}\" must be a string", i, kind),
                  {.path = where});
    }
    const std::string& value = p[kind].get_ref<const std::string&>();
    if (std::string_view(kind) == "text") {
      add_text(value);
      continue;
    }
    const fs::path file = resolve_part_file(value, access, where, i);
    if (std::string_view(kind) == "text_file") {
      std::string text =
          read_file(file, limits.document_bytes - text_bytes, "document's text part");
      if (const size_t nul = text.find('\0'); nul != std::string::npos)
        throw nul_error(file.string(), nul);
      add_text(std::move(text));
      continue;
    }
    Tensor e = npy_parse(read_file(file, limits.media_bytes, "media file"), file.string());
    if (e.rank() != 2 || e.dtype() != DType::f32) {
      throw Error(ErrorKind::format, "media embeddings must be a float32 [rows, hidden] .npy",
                  {.path = file.string()});
    }
    parts.push_back(DocumentPart::of_media(kind, e.to_f32_vector(), e.dim(0)));
  }
  return parts;
}

DocumentParts document_from_line(std::string_view line, const PartsAccess& access,
                                 const InputLimits& limits, const std::string& where) {
  return document_from_json(json_parse(line, where), access, limits, where);
}

LineReader::LineReader(int fd, int64_t max_line_bytes) : fd_(fd), max_(max_line_bytes) {}

bool LineReader::fill() {
  if (eof_) return false;
  if (begin_ > 0 && begin_ * 2 >= buffer_.size()) {
    buffer_.erase(0, begin_);
    begin_ = 0;
  }
  char chunk[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw Error(ErrorKind::io, fmt::format("cannot read the input: {}", std::strerror(errno)));
    }
    if (n == 0) {
      eof_ = true;
      return false;
    }
    buffer_.append(chunk, size_t(n));
    return true;
  }
}

std::optional<LineReader::Line> LineReader::next() {
  if (stopped_) return std::nullopt;
  size_t scanned = 0;  // bytes after begin_ that hold no newline and no NUL
  for (;;) {
    const size_t nl = buffer_.find('\n', begin_ + scanned);
    const size_t end = nl == std::string::npos ? buffer_.size() : nl;
    const size_t nul = buffer_.find('\0', begin_ + scanned);
    if (nul != std::string::npos && nul < end) {
      stopped_ = true;
      return Line{.number = ++number_,
                  .error = fmt::format("line {} holds a NUL byte: the input is binary, not JSON "
                                       "Lines; nothing after it is read",
                                       number_)};
    }
    if (int64_t(end - begin_) > max_) break;  // over the limit: skipped below
    if (nl != std::string::npos || (eof_ && begin_ < buffer_.size())) {
      Line line{.number = ++number_, .text = buffer_.substr(begin_, end - begin_)};
      if (!line.text.empty() && line.text.back() == '\r') line.text.pop_back();
      begin_ = nl == std::string::npos ? buffer_.size() : nl + 1;
      return line;
    }
    if (eof_) return std::nullopt;
    scanned = buffer_.size() - begin_;  // fill() may move the unread part to the front
    fill();
  }
  // A line over the limit: drop what is buffered and read on to its newline, keeping nothing.
  Line line{.number = ++number_,
            .error = fmt::format("line {} is longer than the limit of {} bytes; it was skipped",
                                 number_, max_)};
  for (;;) {
    const size_t nl = buffer_.find('\n', begin_);
    const size_t nul = buffer_.find('\0', begin_);
    if (nul != std::string::npos && (nl == std::string::npos || nul < nl)) {
      stopped_ = true;
      line.error += "; it holds a NUL byte: the input is binary, nothing after it is read";
      return line;
    }
    if (nl != std::string::npos) {
      begin_ = nl + 1;
      return line;
    }
    buffer_.clear();
    begin_ = 0;
    if (!fill()) return line;
  }
}

bool LineReader::ready() {
  if (stopped_ || eof_ || buffer_.find('\n', begin_) != std::string::npos) return true;
  pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
  return ::poll(&p, 1, 0) > 0;
}

}  // namespace deg
