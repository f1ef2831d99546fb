#include "common/tokenizer/regex.h"

#include <oniguruma.h>

#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/tokenizer/unicode.h"

namespace tandem {
namespace {

// Oniguruma allows concurrent searches on one compiled regex (each with its own region),
// but not concurrent compiling or freeing, even of different regexes (rust-onig, which HF
// uses, serializes them the same way).
std::mutex& CompileMutex() {
  static auto* mutex = new std::mutex();
  return *mutex;
}

void InitOnigurumaOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

const UChar* Bytes(std::string_view s) { return reinterpret_cast<const UChar*>(s.data()); }

}  // namespace

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  InitOnigurumaOnce();
  regex_t* compiled = nullptr;
  OnigErrorInfo error_info;
  std::lock_guard<std::mutex> lock(CompileMutex());
  const int rc = onig_new(&compiled, Bytes(pattern), Bytes(pattern) + pattern.size(),
                          ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &error_info);
  if (rc != ONIG_NORMAL) {
    UChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, rc, &error_info);
    return absl::InvalidArgumentError(
        absl::StrCat("bad regex '", std::string(pattern), "': ", reinterpret_cast<char*>(message)));
  }
  return std::unique_ptr<Regex>(new Regex(std::string(pattern), compiled));
}

Regex::~Regex() {
  std::lock_guard<std::mutex> lock(CompileMutex());
  onig_free(static_cast<regex_t*>(regex_));
}

std::vector<std::pair<size_t, size_t>> Regex::FindAll(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  auto* regex = static_cast<regex_t*>(regex_);
  OnigRegion* region = onig_region_new();
  const UChar* begin = Bytes(text);
  const UChar* end = begin + text.size();
  size_t last_end = 0;
  bool have_last_match = false;
  size_t last_match_end = 0;
  while (last_end <= text.size()) {
    onig_region_clear(region);
    const int pos = onig_search(regex, begin, end, begin + last_end, end, region, ONIG_OPTION_NONE);
    if (pos < 0) break;  // ONIG_MISMATCH (or an error, treated as no more matches)
    const size_t s = static_cast<size_t>(region->beg[0]);
    const size_t e = static_cast<size_t>(region->end[0]);
    if (s == e && have_last_match && last_match_end == e) {
      // Empty match right after the previous one: step over one character and retry.
      last_end += last_end < text.size()
                      ? unicode::Utf8Length(static_cast<unsigned char>(text[last_end]))
                      : 1;
      continue;
    }
    last_end = e;
    have_last_match = true;
    last_match_end = e;
    matches.emplace_back(s, e);
    if (s == e && e == text.size()) break;
  }
  onig_region_free(region, 1);
  return matches;
}

std::string RegexEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size() * 2);
  for (char c : text) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) {
      out.push_back('\\');
    }
    out.push_back(c);
  }
  return out;
}

}  // namespace tandem
