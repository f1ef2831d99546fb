#include "common/tokenizer/decoder.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/pattern.h"
#include "common/tokenizer/unicode.h"

namespace tandem {
namespace {

constexpr char kReplacementChar[] = "\xEF\xBF\xBD";

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps)
      : steps_(std::move(steps)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& step : steps_) step->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) token = pattern_.ReplaceAll(token, content_);
  }

 private:
  Pattern pattern_;
  std::string content_;
};

// "<0xAB>" tokens become bytes; runs of them are joined when they form valid UTF-8, else
// each byte becomes U+FFFD.
class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens->size());
    std::string pending;
    const auto flush = [&] {
      if (pending.empty()) return;
      if (unicode::IsValidUtf8(pending)) {
        out.push_back(pending);
      } else {
        for (size_t i = 0; i < pending.size(); ++i) out.emplace_back(kReplacementChar);
      }
      pending.clear();
    };
    for (std::string& token : *tokens) {
      int byte = -1;
      if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>') {
        byte = ParseHexByte(token[3], token[4]);
      }
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    *tokens = std::move(out);
  }

 private:
  static int HexDigit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int ParseHexByte(char hi, char lo) {
    const int l = HexDigit(lo);
    if (l < 0) return -1;
    if (hi == '+') return l;  // Rust's from_str_radix accepts a sign
    const int h = HexDigit(hi);
    return h < 0 ? -1 : h * 16 + l;
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string joined;
    for (const std::string& token : *tokens) joined.append(token);
    tokens->assign(1, std::move(joined));
  }
};

// Removes up to `start` leading and `stop` trailing copies of one character per token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      std::u32string chars = unicode::ToUtf32(token);
      size_t begin = 0;
      while (begin < start_ && begin < chars.size() && chars[begin] == content_) ++begin;
      size_t end = chars.size();
      for (size_t i = 0; i < stop_ && end > begin && chars[end - 1] == content_; ++i) --end;
      token = unicode::ToUtf8(std::u32string_view(chars).substr(begin, end - begin));
    }
  }

 private:
  char32_t content_;
  size_t start_;
  size_t stop_;
};

// Maps GPT-2 byte characters back to bytes and decodes the whole text as lossy UTF-8.
class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::string bytes;
    std::string token_bytes;
    for (const std::string& token : *tokens) {
      token_bytes.clear();
      bool mapped = true;
      size_t pos = 0;
      while (pos < token.size()) {
        const int b = byte_level::CharToByte(unicode::NextCodePoint(token, &pos));
        if (b < 0) {
          mapped = false;
          break;
        }
        token_bytes.push_back(static_cast<char>(b));
      }
      bytes.append(mapped ? token_bytes : token);
    }
    tokens->assign(1, unicode::Utf8Lossy(bytes));
  }
};

class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(char32_t replacement, bool strip_first)
      : replacement_(replacement), strip_first_(strip_first) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      std::string& token = (*tokens)[i];
      std::string out;
      size_t pos = 0;
      while (pos < token.size()) {
        const char32_t cp = unicode::NextCodePoint(token, &pos);
        if (cp != replacement_) {
          unicode::AppendUtf8(cp, &out);
        } else if (!(i == 0 && strip_first_)) {
          out.push_back(' ');
        }
      }
      token = std::move(out);
    }
  }

 private:
  char32_t replacement_;
  bool strip_first_;
};

class BpeSuffixDecoder : public Decoder {
 public:
  explicit BpeSuffixDecoder(std::string suffix) : suffix_(Pattern::FromLiteral(suffix)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (size_t i = 0; i < tokens->size(); ++i) {
      (*tokens)[i] = suffix_.ReplaceAll((*tokens)[i], i + 1 == tokens->size() ? "" : " ");
    }
  }

 private:
  Pattern suffix_;
};

absl::StatusOr<char32_t> SingleChar(const std::string& text, const char* what) {
  const std::u32string chars = unicode::ToUtf32(text);
  if (chars.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(what, " must be one character"));
  }
  return chars[0];
}

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> DecoderFromJson(const nlohmann::json& json) {
  const std::string type = json_util::TypeOf(json);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> steps;
    for (const auto& step : json.at("decoders")) {
      TANDEM_ASSIGN_OR_RETURN(auto decoder, DecoderFromJson(step));
      steps.push_back(std::move(decoder));
    }
    return std::make_unique<SequenceDecoder>(std::move(steps));
  }
  if (type == "Replace") {
    TANDEM_ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(json.at("pattern")));
    return std::make_unique<ReplaceDecoder>(std::move(pattern),
                                            json.at("content").get<std::string>());
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    TANDEM_ASSIGN_OR_RETURN(char32_t content,
                            SingleChar(json.at("content").get<std::string>(), "Strip content"));
    return std::make_unique<StripDecoder>(content, json.at("start").get<size_t>(),
                                          json.at("stop").get<size_t>());
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    TANDEM_ASSIGN_OR_RETURN(
        char32_t replacement,
        SingleChar(json_util::GetString(json, "replacement", "\xE2\x96\x81"), "replacement"));
    bool strip_first = json_util::GetBool(json, "add_prefix_space", true);
    if (json_util::Has(json, "prepend_scheme")) {
      strip_first = json.at("prepend_scheme").get<std::string>() != "never";
    }
    return std::make_unique<MetaspaceDecoder>(replacement, strip_first);
  }
  if (type == "BPEDecoder") {
    return std::make_unique<BpeSuffixDecoder>(json_util::GetString(json, "suffix", "</w>"));
  }
  return absl::UnimplementedError(absl::StrCat("unsupported decoder type '", type, "'"));
}

}  // namespace tandem
