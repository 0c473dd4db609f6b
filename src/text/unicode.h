// Unicode helpers for the tokenizer: UTF-8 decoding and repair, the character classes HF
// `tokenizers` tests with Rust's char methods, case mapping, and Unicode normalization as a
// stream of (char, change) pairs — the contract of the Rust crate unicode-normalization-
// alignments that HF uses, which decides how normalized text aligns back to the original.
// Character data comes from utf8proc; this file holds no Unicode tables of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace deg::text {

// One output character of a normalization step and how it relates to the input characters:
// 0 replaces the next input char, +n (n >= 1) is inserted, -n replaces the next char and
// removes n more (NormalizedString::transform in HF).
struct CharChange {
  char32_t c;
  int change;
};

// ---- UTF-8 ---------------------------------------------------------------------------------

// Length in bytes of the UTF-8 sequence that starts with `lead` (1 for a stray byte).
inline size_t utf8_seq_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

// Decodes the character at s[i] of VALID UTF-8 and advances i past it.
char32_t utf8_next(std::string_view s, size_t& i);
void utf8_append(std::string& out, char32_t c);
size_t utf8_len(char32_t c);
std::u32string utf8_to_u32(std::string_view s);
size_t utf8_count(std::string_view s);  // code points of valid UTF-8

// Length of the longest valid UTF-8 prefix of s.
size_t utf8_valid_prefix(std::string_view s);

// Valid UTF-8 from arbitrary bytes: every maximal invalid subpart becomes U+FFFD (as Python's
// errors="replace" and Rust's from_utf8_lossy do). When anything was replaced and
// `source_offset` is given, it receives, for each byte of the result plus one past the end,
// the offset of the input byte it came from (a U+FFFD maps to the start of its subpart).
std::string utf8_repair(std::string_view bytes, std::vector<uint32_t>* source_offset);

// ---- character classes (as Rust's char methods and regex classes define them) -------------

bool is_whitespace(char32_t c);      // char::is_whitespace: the White_Space property
bool is_numeric(char32_t c);         // char::is_numeric: Nd, Nl, No
bool is_alphanumeric(char32_t c);    // char::is_alphanumeric, approximated by L* and N*
bool is_punctuation(char32_t c);     // ASCII punctuation or a P* category
bool is_combining_mark(char32_t c);  // Mn, Mc, Me
bool is_word_char(char32_t c);       // regex \w: L*, M*, Nd, Nl, Pc, ZWJ/ZWNJ
int combining_class(char32_t c);

// char::to_lowercase: the full lowercase mapping (U+0130 becomes two characters).
void to_lowercase(char32_t c, std::u32string& out);

// ---- normalization -------------------------------------------------------------------------

enum class NormForm { nfd, nfkd, nfc, nfkc };

// The normalized characters of `in` with their changes, exactly as the alignments crate's
// nfd()/nfkd()/nfc()/nfkc() iterators yield them (decomposition marks the first char of an
// expansion 0 and the rest +1; canonical reordering carries the marks along; composition
// adds the changes of the composed chars and subtracts one per merge).
void normalize_changes(const std::u32string& in, NormForm form, std::vector<CharChange>& out);

// True when normalize_changes would return `in` unchanged with all changes 0; cheap.
bool normalization_is_identity(std::string_view utf8, NormForm form);

}  // namespace deg::text
