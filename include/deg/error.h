// deg's error type, part of the public API: every user or I/O error the library reports is a
// deg::Error carrying its kind and the context a user needs to act on it (file path, tensor name,
// JSON pointer). Library code throws; the CLI and the server catch and turn it into an exit code
// or an HTTP status.
#pragma once

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

}  // namespace deg
