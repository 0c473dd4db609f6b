// Python-compatible JSON text (json_text.h). Python's float repr is the shortest string that
// reads back to the same double, in positional notation for decimal exponents -4..15 and in
// scientific notation ("1e-05", "1.5e+16") outside; integral floats keep ".0".
#include "schema/json_text.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "schema/spans.h"

namespace deg::schema {

namespace {

std::string python_float(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  // Shortest round-trip digits, in scientific form: "-d.ddde+XX".
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  const std::string_view sci(buf, size_t(res.ptr - buf));
  const size_t e = sci.find('e');
  const int exponent = std::atoi(std::string(sci.substr(e + 1)).c_str());
  std::string out;
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (c == '-') {
      out.push_back('-');
    } else if (c != '.') {
      digits.push_back(c);
    }
  }
  const int n = int(digits.size());
  if (exponent < -4 || exponent >= 16) {
    out.push_back(digits[0]);
    if (n > 1) {
      out.push_back('.');
      out.append(digits, 1, std::string::npos);
    }
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out.append(exp);
  } else if (exponent < 0) {
    out.append("0.");
    out.append(size_t(-exponent - 1), '0');
    out.append(digits);
  } else if (exponent + 1 >= n) {
    out.append(digits);
    out.append(size_t(exponent + 1 - n), '0');
    out.append(".0");
  } else {
    out.append(digits, 0, size_t(exponent + 1));
    out.push_back('.');
    out.append(digits, size_t(exponent + 1), std::string::npos);
  }
  return out;
}

void dump_string(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\u%04x", c);
          out += esc;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

template <typename J>
void dump(const J& v, std::string& out) {
  switch (v.type()) {
    case J::value_t::null: out += "null"; break;
    case J::value_t::boolean: out += v.template get<bool>() ? "true" : "false"; break;
    case J::value_t::number_integer: out += std::to_string(v.template get<int64_t>()); break;
    case J::value_t::number_unsigned: out += std::to_string(v.template get<uint64_t>()); break;
    case J::value_t::number_float: out += python_float(v.template get<double>()); break;
    case J::value_t::string: dump_string(v.template get_ref<const std::string&>(), out); break;
    case J::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& x : v) {
        if (!first) out += ", ";
        first = false;
        dump(x, out);
      }
      out += ']';
      break;
    }
    case J::value_t::object: {
      out += '{';
      bool first = true;
      for (auto it = v.begin(); it != v.end(); ++it) {
        if (!first) out += ", ";
        first = false;
        dump_string(it.key(), out);
        out += ": ";
        dump(it.value(), out);
      }
      out += '}';
      break;
    }
    default: out += "null"; break;  // binary / discarded values never reach the renderer
  }
}

}  // namespace

std::string json_dumps(const Json& value) {
  std::string out;
  dump(value, out);
  return out;
}

std::string json_dumps(const OrderedJson& value) {
  std::string out;
  dump(value, out);
  return out;
}

std::string one_line(std::string_view text) {
  const auto code_points = utf8_to_code_points(text);
  if (!code_points) return std::string(text);  // schemas were parsed as UTF-8: not reached
  std::u32string out;
  bool pending_space = false;
  for (char32_t c : *code_points) {
    if (is_space(c)) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out += U' ';
    pending_space = false;
    out += c;
  }
  return code_points_to_utf8(out);
}

}  // namespace deg::schema
