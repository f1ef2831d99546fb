#include "common/tokenizer/post_processor.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/json_util.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

class SequenceProcessor : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  void AddSpecialTokens(std::vector<int32_t>* ids) const override {
    for (const auto& step : steps_) step->AddSpecialTokens(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

class NoOpProcessor : public PostProcessor {
 public:
  void AddSpecialTokens(std::vector<int32_t>* ids) const override {}
};

// The sequence's ids between fixed `before` and `after` ids.
class WrapProcessor : public PostProcessor {
 public:
  WrapProcessor(std::vector<int32_t> before, std::vector<int32_t> after)
      : before_(std::move(before)), after_(std::move(after)) {}
  void AddSpecialTokens(std::vector<int32_t>* ids) const override {
    ids->insert(ids->begin(), before_.begin(), before_.end());
    ids->insert(ids->end(), after_.begin(), after_.end());
  }

 private:
  std::vector<int32_t> before_;
  std::vector<int32_t> after_;
};

// TemplateProcessing's `single` template: a list of pieces, each the sequence ($A) or a
// special token (resolved through `special_tokens` to its ids).
absl::StatusOr<std::unique_ptr<PostProcessor>> TemplateFromJson(const nlohmann::json& json) {
  const nlohmann::json& special_tokens = json.at("special_tokens");
  const auto ids_of = [&](const std::string& name) -> absl::StatusOr<std::vector<int32_t>> {
    if (!special_tokens.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("template token '", name, "' is missing from special_tokens"));
    }
    return special_tokens.at(name).at("ids").get<std::vector<int32_t>>();
  };
  std::vector<int32_t> before, after;
  bool seen_sequence = false;
  const auto add_special = [&](const std::string& name) -> absl::Status {
    TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> ids, ids_of(name));
    std::vector<int32_t>& target = seen_sequence ? after : before;
    target.insert(target.end(), ids.begin(), ids.end());
    return absl::OkStatus();
  };
  const nlohmann::json& single = json.at("single");
  if (single.is_string()) {  // "<s> $A" shorthand
    for (absl::string_view part :
         absl::StrSplit(single.get<std::string>(), ' ', absl::SkipEmpty())) {
      std::string piece(part);
      const size_t colon = piece.find(':');
      if (colon != std::string::npos) piece.resize(colon);  // drop ":type_id"
      if (!piece.empty() && piece[0] == '$') {
        seen_sequence = true;
      } else {
        TANDEM_RETURN_IF_ERROR(add_special(piece));
      }
    }
  } else {
    for (const nlohmann::json& piece : single) {
      if (piece.contains("Sequence")) {
        if (seen_sequence) return absl::InvalidArgumentError("template has two sequences");
        seen_sequence = true;
      } else if (piece.contains("SpecialToken")) {
        TANDEM_RETURN_IF_ERROR(add_special(piece.at("SpecialToken").at("id").get<std::string>()));
      } else {
        return absl::InvalidArgumentError("unknown template piece");
      }
    }
  }
  if (!seen_sequence) return absl::InvalidArgumentError("template has no sequence");
  return std::make_unique<WrapProcessor>(std::move(before), std::move(after));
}

}  // namespace

absl::StatusOr<std::unique_ptr<PostProcessor>> PostProcessorFromJson(const nlohmann::json& json) {
  const std::string type = json_util::TypeOf(json);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PostProcessor>> steps;
    for (const auto& step : json.at("processors")) {
      TANDEM_ASSIGN_OR_RETURN(auto processor, PostProcessorFromJson(step));
      steps.push_back(std::move(processor));
    }
    return std::make_unique<SequenceProcessor>(std::move(steps));
  }
  if (type == "TemplateProcessing") return TemplateFromJson(json);
  if (type == "ByteLevel") return std::make_unique<NoOpProcessor>();
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    // "cls": ["[CLS]", 101], "sep": ["[SEP]", 102]
    const int32_t cls = json.at("cls").at(1).get<int32_t>();
    const int32_t sep = json.at("sep").at(1).get<int32_t>();
    return std::make_unique<WrapProcessor>(std::vector<int32_t>{cls}, std::vector<int32_t>{sep});
  }
  return absl::UnimplementedError(absl::StrCat("unsupported post_processor type '", type, "'"));
}

}  // namespace tandem
