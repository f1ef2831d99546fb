#pragma once

#include <cstddef>
#include <string>
#include <string_view>

// UTF-8 and Unicode helpers for the tokenizer. Inputs of the decoding helpers must be valid
// UTF-8 (check with IsValidUtf8 first) unless stated otherwise.
namespace tandem::unicode {

// True when `text` is well-formed UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
bool IsValidUtf8(std::string_view text);

// Byte length of the UTF-8 sequence that starts with `lead` (1 for continuation bytes).
inline size_t Utf8Length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// Decodes the code point at text[pos] (valid UTF-8) and advances pos past it.
char32_t NextCodePoint(std::string_view text, size_t* pos);

// Decodes the last code point of non-empty valid UTF-8 `text`.
char32_t LastCodePoint(std::string_view text);

void AppendUtf8(char32_t cp, std::string* out);
std::u32string ToUtf32(std::string_view text);
std::string ToUtf8(std::u32string_view text);

// Any bytes to valid UTF-8 exactly like Rust's String::from_utf8_lossy: each maximal
// ill-formed subsequence becomes one U+FFFD.
std::string Utf8Lossy(std::string_view bytes);

// Rust's char::is_whitespace (the White_Space property).
bool IsWhitespace(char32_t cp);

// Unicode normalization forms (UTF-8 in, UTF-8 out).
std::string Nfc(std::string_view text);
std::string Nfd(std::string_view text);
std::string Nfkc(std::string_view text);
std::string Nfkd(std::string_view text);

// Full lowercase mapping (like Rust's str::to_lowercase, including final sigma).
std::string ToLower(std::string_view text);
// Python's str.upper (full mapping: "ß" -> "SS"), str.title (titlecase after an uncased
// character, lowercase after a cased one) and str.capitalize (the first character titlecased,
// the rest lowercased).
std::string ToUpper(std::string_view text);
std::string ToTitle(std::string_view text);
std::string Capitalize(std::string_view text);

}  // namespace tandem::unicode
