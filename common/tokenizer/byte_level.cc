#include "common/tokenizer/byte_level.h"

#include <array>

#include "common/tokenizer/unicode.h"

namespace tandem::byte_level {
namespace {

struct Tables {
  std::array<std::string, 256> byte_to_chars;
  std::array<int, 0x144> char_to_byte;  // the image lies below U+0144
};

Tables BuildTables() {
  Tables t;
  t.char_to_byte.fill(-1);
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    const char32_t cp = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + extra++);
    unicode::AppendUtf8(cp, &t.byte_to_chars[b]);
    t.char_to_byte[cp] = b;
  }
  return t;
}

const Tables& GetTables() {
  static const Tables* tables = new Tables(BuildTables());
  return *tables;
}

}  // namespace

std::string_view ByteToChars(unsigned char byte) { return GetTables().byte_to_chars[byte]; }

int CharToByte(char32_t cp) {
  const auto& table = GetTables().char_to_byte;
  return cp < table.size() ? table[cp] : -1;
}

std::string Encode(std::string_view text) {
  const Tables& t = GetTables();
  std::string out;
  out.reserve(text.size() * 2);
  for (unsigned char c : text) out.append(t.byte_to_chars[c]);
  return out;
}

}  // namespace tandem::byte_level
