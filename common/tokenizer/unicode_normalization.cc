// Unicode normalization forms NFC, NFD, NFKC and NFKD (UAX #15) over the generated tables.
#include <algorithm>

#include "common/tokenizer/unicode.h"
#include "common/tokenizer/unicode_tables.h"

namespace tandem::unicode {
namespace {

namespace tables = unicode_tables;

constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int kLCount = 19, kVCount = 21, kTCount = 28;
constexpr int kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

int CombiningClass(char32_t cp) {
  if (cp < 0x300) return 0;
  const auto* begin = tables::kCccRanges;
  const auto* end = begin + tables::kNumCccRanges;
  const auto* it = std::upper_bound(
      begin, end, cp, [](char32_t c, const tables::CccRange& r) { return c < r.first; });
  if (it == begin) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

const tables::Decomposition* FindDecomposition(char32_t cp) {
  const auto* begin = tables::kDecompositions;
  const auto* end = begin + tables::kNumDecompositions;
  const auto* it = std::lower_bound(
      begin, end, cp, [](const tables::Decomposition& d, char32_t c) { return d.cp < c; });
  return (it != end && it->cp == cp) ? it : nullptr;
}

void Decompose(char32_t cp, bool compat, std::u32string* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const int s = static_cast<int>(cp - kSBase);
    out->push_back(kLBase + s / kNCount);
    out->push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out->push_back(kTBase + s % kTCount);
    return;
  }
  const tables::Decomposition* d = cp < 0xA0 ? nullptr : FindDecomposition(cp);
  if (d == nullptr || (d->compat && !compat)) {
    out->push_back(cp);
    return;
  }
  for (int k = 0; k < d->length; ++k)
    Decompose(tables::kDecompositionPool[d->offset + k], compat, out);
}

char32_t Compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  }
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount) {
    return a + (b - kTBase);
  }
  const auto* begin = tables::kCompositions;
  const auto* end = begin + tables::kNumCompositions;
  const auto* it =
      std::lower_bound(begin, end, std::make_pair(a, b),
                       [](const tables::Composition& c, std::pair<char32_t, char32_t> k) {
                         return std::make_pair(c.first, c.second) < k;
                       });
  return (it != end && it->first == a && it->second == b) ? it->composite : 0;
}

// Full decomposition followed by the canonical ordering algorithm.
std::u32string DecomposeAndOrder(std::string_view text, bool compat) {
  std::u32string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) Decompose(NextCodePoint(text, &pos), compat, &out);
  // Stable sort each run of non-starters by combining class.
  size_t i = 0;
  while (i < out.size()) {
    if (CombiningClass(out[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < out.size() && CombiningClass(out[j]) != 0) ++j;
    if (j - i > 1) {
      std::stable_sort(out.begin() + i, out.begin() + j, [](char32_t x, char32_t y) {
        return CombiningClass(x) < CombiningClass(y);
      });
    }
    i = j;
  }
  return out;
}

std::u32string Recompose(const std::u32string& in) {
  std::u32string out;
  out.reserve(in.size());
  long starter = -1;  // index in `out` of the last starter
  int last_ccc = 0;   // class of the last character appended after the starter
  for (char32_t cp : in) {
    const int ccc = CombiningClass(cp);
    if (starter >= 0) {
      const bool adjacent = static_cast<long>(out.size()) - 1 == starter;
      if (adjacent || (last_ccc != 0 && last_ccc < ccc)) {
        const char32_t composite = Compose(out[starter], cp);
        if (composite != 0) {
          out[starter] = composite;
          continue;
        }
      }
    }
    if (ccc == 0) starter = static_cast<long>(out.size());
    out.push_back(cp);
    last_ccc = ccc;
  }
  return out;
}

// Text made only of code points below U+0300 is unchanged by NFC and NFD... except for
// precomposed Latin-1 letters under NFD/NFKD; callers use this for the composed forms only.
bool BelowCombiningMarks(std::string_view text) {
  for (unsigned char c : text) {
    if (c >= 0xCC) return false;  // lead bytes of U+0300 and above
  }
  return true;
}

bool IsAscii(std::string_view text) {
  for (unsigned char c : text) {
    if (c >= 0x80) return false;
  }
  return true;
}

}  // namespace

std::string Nfc(std::string_view text) {
  if (BelowCombiningMarks(text)) return std::string(text);
  return ToUtf8(Recompose(DecomposeAndOrder(text, /*compat=*/false)));
}

std::string Nfd(std::string_view text) {
  if (IsAscii(text)) return std::string(text);
  return ToUtf8(DecomposeAndOrder(text, /*compat=*/false));
}

std::string Nfkc(std::string_view text) {
  if (IsAscii(text)) return std::string(text);
  return ToUtf8(Recompose(DecomposeAndOrder(text, /*compat=*/true)));
}

std::string Nfkd(std::string_view text) {
  if (IsAscii(text)) return std::string(text);
  return ToUtf8(DecomposeAndOrder(text, /*compat=*/true));
}

}  // namespace tandem::unicode
