// The GPT-2 byte-level alphabet: each of the 256 byte values as one printable character
// (printable Latin-1 bytes stand for themselves, the others for U+0100 + n). Shared by the
// ByteLevel pre-tokenizer, decoder and post-processor.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace deg::text {

struct ByteLevelAlphabet {
  std::array<char32_t, 256> char_of_byte;
  std::array<std::string, 256> utf8_of_byte;  // char_of_byte as UTF-8 (1 or 2 bytes)
  std::array<int16_t, 324> byte_of_char;      // -1 for chars outside the alphabet
};

inline const ByteLevelAlphabet& byte_level_alphabet() {
  static const ByteLevelAlphabet alphabet = [] {
    ByteLevelAlphabet a{};
    a.byte_of_char.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      char32_t c = printable(b) ? char32_t(b) : char32_t(256 + n++);
      a.char_of_byte[b] = c;
      a.byte_of_char[c] = static_cast<int16_t>(b);
      std::string& s = a.utf8_of_byte[b];
      if (c < 0x80) {
        s.push_back(static_cast<char>(c));
      } else {
        s.push_back(static_cast<char>(0xC0 | (c >> 6)));
        s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
      }
    }
    return a;
  }();
  return alphabet;
}

}  // namespace deg::text
