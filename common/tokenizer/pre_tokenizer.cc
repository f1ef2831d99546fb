#include "common/tokenizer/pre_tokenizer.h"

#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/pattern.h"
#include "common/tokenizer/split_behavior.h"
#include "common/tokenizer/unicode.h"

namespace tandem {
namespace {

// GPT-2's pre-tokenization regex (ByteLevel with use_regex).
constexpr char kGpt2Regex[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Replaces each piece by the non-empty pieces that `split` makes of it.
void SplitEach(std::vector<PreToken>* pieces,
               const std::function<std::vector<PatternPiece>(std::string_view)>& find,
               SplitBehavior behavior) {
  std::vector<PreToken> out;
  out.reserve(pieces->size());
  for (PreToken& piece : *pieces) {
    for (const auto& [begin, end] : ApplySplitBehavior(find(piece.text), behavior)) {
      if (begin == end) continue;
      out.push_back({piece.text.substr(begin, end - begin), piece.at_start && begin == 0});
    }
  }
  *pieces = std::move(out);
}

// Each code point for which `pred` holds is one match.
std::vector<PatternPiece> MatchChars(std::string_view text, bool (*pred)(char32_t)) {
  std::vector<PatternPiece> pieces;
  size_t prev = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t begin = pos;
    if (pred(unicode::NextCodePoint(text, &pos))) {
      if (prev != begin) pieces.push_back({prev, begin, false});
      pieces.push_back({begin, pos, true});
      prev = pos;
    }
  }
  if (prev != text.size() || text.empty()) pieces.push_back({prev, text.size(), false});
  return pieces;
}

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps)
      : steps_(std::move(steps)) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    for (const auto& step : steps_) step->PreTokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

// Split (and the regex-based fixed pre-tokenizers): cut at pattern matches.
class PatternPreTokenizer : public PreTokenizer {
 public:
  PatternPreTokenizer(Pattern pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    SplitEach(
        pieces,
        [this](std::string_view text) {
          std::vector<PatternPiece> matches = pattern_.FindMatches(text);
          if (invert_) {
            for (auto& m : matches) m.is_match = !m.is_match;
          }
          return matches;
        },
        behavior_);
  }

 private:
  Pattern pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

// Cuts at single code points that satisfy a predicate (WhitespaceSplit, Punctuation, ...).
class CharPreTokenizer : public PreTokenizer {
 public:
  CharPreTokenizer(bool (*pred)(char32_t), SplitBehavior behavior)
      : pred_(pred), behavior_(behavior) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    SplitEach(
        pieces, [this](std::string_view text) { return MatchChars(text, pred_); }, behavior_);
  }

 private:
  bool (*pred_)(char32_t);
  SplitBehavior behavior_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Pattern> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    if (add_prefix_space_) {
      for (PreToken& piece : *pieces) {
        if (piece.text.empty() || piece.text[0] != ' ') piece.text = " " + piece.text;
      }
    }
    if (regex_ != nullptr) {
      SplitEach(
          pieces, [this](std::string_view text) { return regex_->FindMatches(text); },
          SplitBehavior::kIsolated);
    }
    for (PreToken& piece : *pieces) piece.text = byte_level::Encode(piece.text);
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Pattern> regex_;  // GPT-2 regex when use_regex
};

enum class PrependScheme { kAlways, kFirst, kNever };

class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)),
        space_(Pattern::FromLiteral(" ")),
        marker_(Pattern::FromLiteral(replacement_)),
        scheme_(scheme),
        split_(split) {}
  void PreTokenize(std::vector<PreToken>* pieces) const override {
    for (PreToken& piece : *pieces) {
      piece.text = space_.ReplaceAll(piece.text, replacement_);
      const bool starts = piece.text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == PrependScheme::kAlways ||
                      (scheme_ == PrependScheme::kFirst && piece.at_start))) {
        piece.text.insert(0, replacement_);
      }
    }
    if (!split_) return;
    SplitEach(
        pieces, [this](std::string_view text) { return marker_.FindMatches(text); },
        SplitBehavior::kMergedWithNext);
  }

 private:
  std::string replacement_;
  Pattern space_;
  Pattern marker_;
  PrependScheme scheme_;
  bool split_;
};

bool IsWhitespaceChar(char32_t cp) { return unicode::IsWhitespace(cp); }

absl::StatusOr<SplitBehavior> BehaviorFromJson(const nlohmann::json& json) {
  const std::string name = json_util::GetString(json, "behavior", "Isolated");
  SplitBehavior behavior;
  if (!ParseSplitBehavior(name, &behavior)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown split behavior '", name, "'"));
  }
  return behavior;
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> RegexPreTokenizer(std::string_view regex,
                                                                SplitBehavior behavior,
                                                                bool invert) {
  TANDEM_ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromRegex(regex));
  return std::make_unique<PatternPreTokenizer>(std::move(pattern), behavior, invert);
}

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizerFromJson(const nlohmann::json& json) {
  const std::string type = json_util::TypeOf(json);
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    for (const auto& step : json.at("pretokenizers")) {
      TANDEM_ASSIGN_OR_RETURN(auto pre_tokenizer, PreTokenizerFromJson(step));
      steps.push_back(std::move(pre_tokenizer));
    }
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  if (type == "Split") {
    TANDEM_ASSIGN_OR_RETURN(SplitBehavior behavior, BehaviorFromJson(json));
    const nlohmann::json& spec = json.at("pattern");
    // HF compiles a String pattern as an escaped regex; a literal search is equivalent.
    TANDEM_ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromJson(spec));
    return std::make_unique<PatternPreTokenizer>(std::move(pattern), behavior,
                                                 json_util::GetBool(json, "invert", false));
  }
  if (type == "ByteLevel") {
    std::unique_ptr<Pattern> regex;
    if (json_util::GetBool(json, "use_regex", true)) {
      TANDEM_ASSIGN_OR_RETURN(Pattern pattern, Pattern::FromRegex(kGpt2Regex));
      regex = std::make_unique<Pattern>(std::move(pattern));
    }
    return std::make_unique<ByteLevelPreTokenizer>(
        json_util::GetBool(json, "add_prefix_space", true), std::move(regex));
  }
  if (type == "Metaspace") {
    PrependScheme scheme = PrependScheme::kAlways;
    if (json_util::Has(json, "prepend_scheme")) {
      const std::string name = json.at("prepend_scheme").get<std::string>();
      if (name == "first") {
        scheme = PrependScheme::kFirst;
      } else if (name == "never") {
        scheme = PrependScheme::kNever;
      } else if (name != "always") {
        return absl::InvalidArgumentError(absl::StrCat("unknown prepend_scheme '", name, "'"));
      }
    } else if (!json_util::GetBool(json, "add_prefix_space", true)) {
      scheme = PrependScheme::kNever;
    }
    return std::make_unique<MetaspacePreTokenizer>(
        json_util::GetString(json, "replacement", "\xE2\x96\x81"), scheme,
        json_util::GetBool(json, "split", true));
  }
  if (type == "Whitespace") {
    return RegexPreTokenizer(R"(\w+|[^\w\s]+)", SplitBehavior::kRemoved, /*invert=*/true);
  }
  if (type == "WhitespaceSplit") {
    return std::make_unique<CharPreTokenizer>(&IsWhitespaceChar, SplitBehavior::kRemoved);
  }
  if (type == "Digits") {
    return RegexPreTokenizer(R"(\p{N})",
                             json_util::GetBool(json, "individual_digits", false)
                                 ? SplitBehavior::kIsolated
                                 : SplitBehavior::kContiguous,
                             /*invert=*/false);
  }
  constexpr char kPunctuation[] = R"([\p{P}!-/:-@\[-`{-~])";
  if (type == "Punctuation") {
    TANDEM_ASSIGN_OR_RETURN(SplitBehavior behavior, BehaviorFromJson(json));
    return RegexPreTokenizer(kPunctuation, behavior, /*invert=*/false);
  }
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    steps.push_back(std::make_unique<CharPreTokenizer>(&IsWhitespaceChar, SplitBehavior::kRemoved));
    TANDEM_ASSIGN_OR_RETURN(auto punct,
                            RegexPreTokenizer(kPunctuation, SplitBehavior::kIsolated, false));
    steps.push_back(std::move(punct));
    return std::make_unique<SequencePreTokenizer>(std::move(steps));
  }
  return absl::UnimplementedError(absl::StrCat("unsupported pre_tokenizer type '", type, "'"));
}

}  // namespace tandem
