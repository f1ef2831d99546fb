#include "common/tokenizer/unicode.h"

#include <algorithm>

#include "common/tokenizer/unicode_tables.h"

namespace tandem::unicode {
namespace {

bool IsContinuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// Length of the longest prefix of bytes[pos..] that is a valid UTF-8 sequence or a valid
// beginning of one; `complete` tells which. Follows Rust's core::str validation rules.
size_t ScanSequence(std::string_view bytes, size_t pos, bool* complete) {
  const auto at = [&](size_t i) -> int {
    return i < bytes.size() ? static_cast<unsigned char>(bytes[i]) : -1;
  };
  const int b0 = at(pos);
  *complete = false;
  if (b0 < 0x80) {
    *complete = true;
    return 1;
  }
  size_t width = 0;
  int lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    width = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    width = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    width = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 1;  // invalid lead byte
  }
  const int b1 = at(pos + 1);
  if (b1 < lo || b1 > hi) return 1;
  for (size_t k = 2; k < width; ++k) {
    const int b = at(pos + k);
    if (b < 0 || !IsContinuation(static_cast<unsigned char>(b))) return k;
  }
  *complete = true;
  return width;
}

}  // namespace

bool IsValidUtf8(std::string_view text) {
  size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    bool complete = false;
    const size_t n = ScanSequence(text, pos, &complete);
    if (!complete) return false;
    pos += n;
  }
  return true;
}

char32_t NextCodePoint(std::string_view text, size_t* pos) {
  const auto b0 = static_cast<unsigned char>(text[*pos]);
  const size_t n = std::min(Utf8Length(b0), text.size() - *pos);
  char32_t cp;
  if (n == 1) {
    cp = b0;
  } else if (n == 2) {
    cp = b0 & 0x1F;
  } else if (n == 3) {
    cp = b0 & 0x0F;
  } else {
    cp = b0 & 0x07;
  }
  for (size_t k = 1; k < n; ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(text[*pos + k]) & 0x3F);
  *pos += n;
  return cp;
}

char32_t LastCodePoint(std::string_view text) {
  size_t start = text.size() - 1;
  while (start > 0 && IsContinuation(static_cast<unsigned char>(text[start]))) --start;
  return NextCodePoint(text, &start);
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::u32string ToUtf32(std::string_view text) {
  std::u32string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) out.push_back(NextCodePoint(text, &pos));
  return out;
}

std::string ToUtf8(std::u32string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t cp : text) AppendUtf8(cp, &out);
  return out;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    bool complete = false;
    const size_t n = ScanSequence(bytes, pos, &complete);
    if (complete) {
      out.append(bytes.substr(pos, n));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    pos += n;
  }
  return out;
}

bool IsWhitespace(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

namespace {

// The entry for `cp` of a table sorted by code point; null when it has none.
template <typename Entry>
const Entry* FindCase(const Entry* table, int n, char32_t cp) {
  const Entry* end = table + n;
  const Entry* it =
      std::lower_bound(table, end, cp, [](const Entry& m, char32_t c) { return m.cp < c; });
  return (it != end && it->cp == cp) ? it : nullptr;
}

// Approximation of the Cased property: letters that take part in case mapping.
bool IsCased(char32_t cp) {
  if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return true;
  if (cp < 0x80) return false;
  return FindCase(unicode_tables::kLowercase, unicode_tables::kNumLowercase, cp) != nullptr ||
         FindCase(unicode_tables::kUppercase, unicode_tables::kNumUppercase, cp) != nullptr ||
         FindCase(unicode_tables::kUppercaseMulti, unicode_tables::kNumUppercaseMulti, cp) !=
             nullptr;
}

// Appends the mapping of `cp` by a (simple, multi) pair of tables; `cp` itself when unmapped.
void AppendMapped(char32_t cp, const unicode_tables::CaseMapping* simple, int num_simple,
                  const unicode_tables::MultiCaseMapping* multi, int num_multi, std::string* out) {
  if (const auto* m = FindCase(multi, num_multi, cp)) {
    for (char32_t c : m->mapped) {
      if (c != 0) AppendUtf8(c, out);
    }
    return;
  }
  const auto* s = FindCase(simple, num_simple, cp);
  AppendUtf8(s != nullptr ? s->mapped : cp, out);
}

void AppendUpper(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp >= 'a' && cp <= 'z' ? cp - 32 : cp));
    return;
  }
  AppendMapped(cp, unicode_tables::kUppercase, unicode_tables::kNumUppercase,
               unicode_tables::kUppercaseMulti, unicode_tables::kNumUppercaseMulti, out);
}

// The titlecase mapping of one character (str.title's first letter of a word).
void AppendTitle(char32_t cp, std::string* out) {
  if (FindCase(unicode_tables::kTitlecase, unicode_tables::kNumTitlecase, cp) != nullptr ||
      FindCase(unicode_tables::kTitlecaseMulti, unicode_tables::kNumTitlecaseMulti, cp) !=
          nullptr) {
    AppendMapped(cp, unicode_tables::kTitlecase, unicode_tables::kNumTitlecase,
                 unicode_tables::kTitlecaseMulti, unicode_tables::kNumTitlecaseMulti, out);
    return;
  }
  AppendUpper(cp, out);
}

// The lowercase mapping of cps[i] in its context (a capital sigma at the end of a word is final).
void AppendLower(const std::u32string& cps, size_t i, std::string* out) {
  const char32_t cp = cps[i];
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
    return;
  }
  if (cp == 0x03A3) {
    const bool after_cased = i > 0 && IsCased(cps[i - 1]);
    const bool before_cased = i + 1 < cps.size() && IsCased(cps[i + 1]);
    AppendUtf8(after_cased && !before_cased ? 0x03C2 : 0x03C3, out);
    return;
  }
  AppendMapped(cp, unicode_tables::kLowercase, unicode_tables::kNumLowercase,
               unicode_tables::kLowercaseMulti, unicode_tables::kNumLowercaseMulti, out);
}

}  // namespace

std::string ToLower(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const std::u32string cps = ToUtf32(text);
  for (size_t i = 0; i < cps.size(); ++i) AppendLower(cps, i, &out);
  return out;
}

std::string ToUpper(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char32_t cp : ToUtf32(text)) AppendUpper(cp, &out);
  return out;
}

std::string ToTitle(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const std::u32string cps = ToUtf32(text);
  bool previous_cased = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (previous_cased) {
      AppendLower(cps, i, &out);
    } else {
      AppendTitle(cps[i], &out);
    }
    previous_cased = IsCased(cps[i]);
  }
  return out;
}

std::string Capitalize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  const std::u32string cps = ToUtf32(text);
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i == 0) {
      AppendTitle(cps[i], &out);
    } else {
      AppendLower(cps, i, &out);
    }
  }
  return out;
}

}  // namespace tandem::unicode
