#include "common/tokenizer/normalizer.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/pattern.h"
#include "common/tokenizer/unicode.h"

namespace tandem {
namespace {

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps)
      : steps_(std::move(steps)) {}
  void Normalize(std::string* text) const override {
    for (const auto& step : steps_) step->Normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(Pattern pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Normalize(std::string* text) const override { *text = pattern_.ReplaceAll(*text, content_); }

 private:
  Pattern pattern_;
  std::string content_;
};

class FunctionNormalizer : public Normalizer {
 public:
  explicit FunctionNormalizer(std::string (*fn)(std::string_view)) : fn_(fn) {}
  void Normalize(std::string* text) const override { *text = fn_(*text); }

 private:
  std::string (*fn_)(std::string_view);
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Normalize(std::string* text) const override {
    size_t begin = 0;
    size_t end = text->size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!unicode::IsWhitespace(unicode::NextCodePoint(*text, &next))) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>((*text)[start]) & 0xC0) == 0x80) {
          --start;
        }
        size_t probe = start;
        if (!unicode::IsWhitespace(unicode::NextCodePoint(*text, &probe))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
  }

 private:
  bool left_;
  bool right_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> NormalizerFromJson(const nlohmann::json& json) {
  const std::string type = json_util::TypeOf(json);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const auto& step : json.at("normalizers")) {
      TANDEM_ASSIGN_OR_RETURN(auto normalizer, NormalizerFromJson(step));
      steps.push_back(std::move(normalizer));
    }
    return std::make_unique<SequenceNormalizer>(std::move(steps));
  }
  if (type == "Prepend") {
    return std::make_unique<PrependNormalizer>(json.at("prepend").get<std::string>());
  }
  if (type == "Replace") {
    TANDEM_ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(json.at("pattern")));
    return std::make_unique<ReplaceNormalizer>(std::move(pattern),
                                               json.at("content").get<std::string>());
  }
  if (type == "NFC") return std::make_unique<FunctionNormalizer>(&unicode::Nfc);
  if (type == "NFD") return std::make_unique<FunctionNormalizer>(&unicode::Nfd);
  if (type == "NFKC") return std::make_unique<FunctionNormalizer>(&unicode::Nfkc);
  if (type == "NFKD") return std::make_unique<FunctionNormalizer>(&unicode::Nfkd);
  if (type == "Lowercase") return std::make_unique<FunctionNormalizer>(&unicode::ToLower);
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(json_util::GetBool(json, "strip_left", true),
                                             json_util::GetBool(json, "strip_right", true));
  }
  return absl::UnimplementedError(absl::StrCat("unsupported normalizer type '", type, "'"));
}

}  // namespace tandem
