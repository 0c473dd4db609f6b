// Errors, in two tiers (STYLE.md §7): DEG_CHECK for programmer invariants (prints file:line and
// aborts), deg::Error for user and I/O errors, carrying the context a user needs to act on it
// (file path, tensor name, JSON pointer). Library code throws; only the CLI and the server catch.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace deg {

enum class ErrorKind {
  invalid_argument,  // a bad option or value given by the user
  not_found,         // a missing file, tensor, key
  io,                // the operating system refused (open, read, mmap)
  format,            // a file or document that is not what it claims to be
  unsupported,       // valid input that deg does not handle (yet)
  internal,          // a bug: should have been a DEG_CHECK
};

struct ErrorContext {
  std::string path;     // file or directory the error is about
  std::string tensor;   // tensor name, when one is involved
  std::string pointer;  // JSON pointer into a config, schema or document
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, ErrorContext context = {});

  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }
  const ErrorContext& context() const { return context_; }

  // Adds context on the way up; fields already set are kept (the innermost knows best).
  Error with_path(const std::string& path) const;
  Error with_tensor(const std::string& tensor) const;
  Error with_pointer(const std::string& pointer) const;

 private:
  static std::string render(const std::string& message, const ErrorContext& context);

  ErrorKind kind_;
  std::string message_;
  ErrorContext context_;
};

const char* error_kind_name(ErrorKind kind);

[[noreturn]] void check_failed(const char* file, int line, const char* condition,
                               const std::string& message);

}  // namespace deg

// DEG_CHECK(cond, "fmt {}", args...): an invariant of the code, never of user input.
#define DEG_CHECK(cond, ...)                                                      \
  do {                                                                            \
    if (!(cond)) [[unlikely]]                                                     \
      ::deg::check_failed(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__)); \
  } while (0)
