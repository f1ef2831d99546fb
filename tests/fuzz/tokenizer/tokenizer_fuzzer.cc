// Fuzzes the tokenizers the project ships or tests (stories260k, gpt2, llama2, llama3, qwen3):
// encode / decode round trips on arbitrary text and decoding of arbitrary ids, in one shot and
// incrementally (StreamDecoder, as the router does).
//
// Input: byte 0 picks the tokenizer and flags, byte 1 the mode, the rest is text (mode 0) or
// little-endian u16 token ids (mode 1). Checked: Encode fails exactly on invalid UTF-8; ids are
// in range; Decode succeeds on in-range ids and fails on others; every decoded text and stream
// chunk is valid UTF-8 (it goes into proto string fields); byte-level tokenizers without a
// normalizer (gpt2, llama3) give the text back exactly.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/tokenizer/stream_decoder.h"
#include "common/tokenizer/tokenizer.h"
#include "tests/util/test_paths.h"

namespace {

struct Entry {
  std::unique_ptr<tandem::Tokenizer> tokenizer;
  bool exact_round_trip;
};

std::vector<Entry>& Tokenizers() {
  static std::vector<Entry>* entries = [] {
    auto* out = new std::vector<Entry>;
    const std::string root = tandem::TestSourceDir();
    const std::pair<const char*, bool> files[] = {
        {"/models/stories260k/tokenizer.json", false},
        {"/tests/data/tokenizers/gpt2/tokenizer.json", true},
        {"/tests/data/tokenizers/llama2/tokenizer.json", false},
        {"/tests/data/tokenizers/llama3/tokenizer.json", true},
        {"/tests/data/tokenizers/qwen3/tokenizer.json", false},
    };
    for (const auto& [file, exact] : files) {
      auto t = tandem::Tokenizer::FromFile(root + file);
      if (!t.ok()) {
        std::fprintf(stderr, "cannot load %s: %s\n", file,
                     std::string(t.status().message()).c_str());
        std::abort();
      }
      out->push_back({std::move(t).value(), exact});
    }
    return out;
  }();
  return *entries;
}

bool ValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    int len = c < 0x80             ? 1
              : (c & 0xe0) == 0xc0 ? 2
              : (c & 0xf0) == 0xe0 ? 3
              : (c & 0xf8) == 0xf0 ? 4
                                   : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = len == 1 ? c : c & (0x7f >> len);
    for (int k = 1; k < len; ++k) {
      const unsigned char d = s[i + k];
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

#define FUZZ_CHECK(cond)                                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

void CheckDecode(const tandem::Tokenizer& t, const std::vector<int32_t>& ids, bool skip_special) {
  bool in_range = true;
  for (int32_t id : ids) in_range = in_range && id >= 0 && id < t.vocab_size();
  auto text = t.Decode(ids, skip_special);
  FUZZ_CHECK(text.ok() == in_range);
  if (text.ok()) FUZZ_CHECK(ValidUtf8(*text));
  tandem::StreamDecoder stream(t, skip_special);
  for (int32_t id : ids) {
    auto piece = stream.StepOrError(id);
    if (!piece.ok() && id >= 0 && id < t.vocab_size()) {
      std::fprintf(stderr, "id %d: %s\n", id, std::string(piece.status().message()).c_str());
    }
    FUZZ_CHECK(piece.ok() == (id >= 0 && id < t.vocab_size()));
    if (!piece.ok()) break;  // the router never feeds a stream an id outside the vocabulary
    if (piece->has_value()) FUZZ_CHECK(ValidUtf8(**piece));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  std::vector<Entry>& all = Tokenizers();
  const Entry& entry = all[data[0] % all.size()];
  const tandem::Tokenizer& t = *entry.tokenizer;
  const bool add_special = data[0] & 0x10, parse_special = data[0] & 0x20;
  const bool skip_special = data[0] & 0x40;
  const std::string_view rest(reinterpret_cast<const char*>(data + 2), size - 2);
  if (data[1] % 2 == 0) {
    auto ids = t.Encode(rest, add_special, parse_special);
    FUZZ_CHECK(ids.ok() == ValidUtf8(rest));
    if (!ids.ok()) return 0;
    for (int32_t id : *ids) FUZZ_CHECK(id >= 0 && id < t.vocab_size());
    CheckDecode(t, *ids, skip_special);
    if (entry.exact_round_trip && !add_special && !parse_special) {
      auto text = t.Decode(*ids, false);
      FUZZ_CHECK(text.ok() && *text == rest);
    }
  } else {
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < rest.size(); i += 2) {
      const uint16_t v = static_cast<uint8_t>(rest[i]) | static_cast<uint8_t>(rest[i + 1]) << 8;
      // Mostly in range, sometimes just outside it or negative.
      ids.push_back(v % 64 == 63 ? t.vocab_size() + (v % 3) - 1 - (v % 5 == 0) * t.vocab_size()
                                 : static_cast<int32_t>(v % t.vocab_size()));
    }
    CheckDecode(t, ids, skip_special);
  }
  return 0;
}
