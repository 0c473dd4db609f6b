// Error rendering: "<path>: tensor '<name>': at <pointer>: <message>", each part only when known.
#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace deg {

Error::Error(ErrorKind kind, std::string message, ErrorContext context)
    : std::runtime_error(render(message, context)),
      kind_(kind),
      message_(std::move(message)),
      context_(std::move(context)) {}

std::string Error::render(const std::string& message, const ErrorContext& context) {
  std::string out;
  if (!context.path.empty()) out += context.path + ": ";
  if (!context.tensor.empty()) out += "tensor '" + context.tensor + "': ";
  if (!context.pointer.empty()) out += "at " + context.pointer + ": ";
  return out + message;
}

Error Error::with_path(const std::string& path) const {
  ErrorContext c = context_;
  if (c.path.empty()) c.path = path;
  return Error(kind_, message_, c);
}

Error Error::with_tensor(const std::string& tensor) const {
  ErrorContext c = context_;
  if (c.tensor.empty()) c.tensor = tensor;
  return Error(kind_, message_, c);
}

Error Error::with_pointer(const std::string& pointer) const {
  ErrorContext c = context_;
  if (c.pointer.empty()) c.pointer = pointer;
  return Error(kind_, message_, c);
}

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::invalid_argument: return "invalid argument";
    case ErrorKind::not_found: return "not found";
    case ErrorKind::io: return "i/o error";
    case ErrorKind::format: return "format error";
    case ErrorKind::unsupported: return "unsupported";
    case ErrorKind::internal: return "internal error";
  }
  return "error";
}

void check_failed(const char* file, int line, const char* condition, const std::string& message) {
  std::fprintf(stderr, "deg: internal check failed at %s:%d: %s: %s\n", file, line, condition,
               message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace deg
