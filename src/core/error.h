// Errors, in two tiers (STYLE.md §7): DEG_CHECK for programmer invariants (prints file:line and
// aborts), deg::Error (include/deg/error.h, public) for user and I/O errors.
#pragma once

#include <fmt/format.h>

#include <string>

#include "deg/error.h"

namespace deg {

[[noreturn]] void check_failed(const char* file, int line, const char* condition,
                               const std::string& message);

}  // namespace deg

// DEG_CHECK(cond, "fmt {}", args...): an invariant of the code, never of user input.
#define DEG_CHECK(cond, ...)                                                      \
  do {                                                                            \
    if (!(cond)) [[unlikely]]                                                     \
      ::deg::check_failed(__FILE__, __LINE__, #cond, ::fmt::format(__VA_ARGS__)); \
  } while (0)
