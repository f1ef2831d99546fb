#include "common/tokenizer/tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/mapped_file.h"
#include "common/base/status_macros.h"
#include "common/tokenizer/added_vocabulary.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/decoder.h"
#include "common/tokenizer/json_util.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/post_processor.h"
#include "common/tokenizer/pre_tokenizer.h"
#include "common/tokenizer/tokenizer_json.h"
#include "common/tokenizer/unicode.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

// Prefixes a component's error with the file it came from.
absl::Status Annotate(const absl::Status& status, const std::string& origin) {
  return absl::Status(status.code(), absl::StrCat(origin, ": ", status.message()));
}

bool FileExists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

absl::StatusOr<nlohmann::json> ParseJson(std::string_view text, const std::string& origin) {
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": invalid JSON: ", e.what()));
  }
}

// tokenizer_config.json names tokens as a string or as an AddedToken object.
std::optional<std::string> ConfigTokenName(const nlohmann::json& config, const char* key) {
  if (!json_util::Has(config, key)) return std::nullopt;
  const nlohmann::json& value = config.at(key);
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value.at("content").is_string()) {
    return value.at("content").get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(
    const std::string& tokenizer_json_path) {
  auto file = MappedFile::Open(tokenizer_json_path);
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat("cannot load tokenizer: ", file.status().message()));
  }
  const std::string_view text(reinterpret_cast<const char*>((*file)->data()), (*file)->size());
  return FromJsonText(text, tokenizer_json_path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromModelDir(const std::string& dir) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                          FromFile(absl::StrCat(dir, "/tokenizer.json")));
  const std::string config_path = absl::StrCat(dir, "/tokenizer_config.json");
  if (FileExists(config_path)) TANDEM_RETURN_IF_ERROR(tokenizer->LoadConfig(config_path));
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJsonText(std::string_view text,
                                                                   const std::string& origin) {
  TANDEM_ASSIGN_OR_RETURN(ParsedTokenizerJson parsed, ParseTokenizerJson(text, origin));
  const nlohmann::json& json = parsed.json;
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  const auto build = [&]() -> absl::Status {
    if (!json.is_object()) return absl::InvalidArgumentError("not a JSON object");
    if (!json.contains("model")) return absl::InvalidArgumentError("no \"model\"");
    TANDEM_ASSIGN_OR_RETURN(tok->model_, BpeModel::Create(json.at("model"), std::move(parsed.bpe)));
    if (json_util::Has(json, "normalizer")) {
      TANDEM_ASSIGN_OR_RETURN(tok->normalizer_, NormalizerFromJson(json.at("normalizer")));
    }
    if (json_util::Has(json, "pre_tokenizer")) {
      TANDEM_ASSIGN_OR_RETURN(tok->pre_tokenizer_, PreTokenizerFromJson(json.at("pre_tokenizer")));
    }
    if (json_util::Has(json, "post_processor")) {
      TANDEM_ASSIGN_OR_RETURN(tok->post_processor_,
                              PostProcessorFromJson(json.at("post_processor")));
    }
    if (json_util::Has(json, "decoder")) {
      TANDEM_ASSIGN_OR_RETURN(tok->decoder_, DecoderFromJson(json.at("decoder")));
    }
    std::vector<AddedToken> added;
    int32_t vocab_size = tok->model_->id_limit();
    if (json_util::Has(json, "added_tokens")) {
      for (const nlohmann::json& entry : json.at("added_tokens")) {
        AddedToken token;
        token.content = entry.at("content").get<std::string>();
        token.id = entry.at("id").get<int32_t>();
        // Like HF, a token that the model already has keeps the model's id.
        if (const auto model_id = tok->model_->TokenToId(token.content)) token.id = *model_id;
        token.special = json_util::GetBool(entry, "special", false);
        token.single_word = json_util::GetBool(entry, "single_word", false);
        token.lstrip = json_util::GetBool(entry, "lstrip", false);
        token.rstrip = json_util::GetBool(entry, "rstrip", false);
        token.normalized = json_util::GetBool(entry, "normalized", !token.special);
        vocab_size = std::max(vocab_size, token.id + 1);
        added.push_back(std::move(token));
      }
    }
    TANDEM_ASSIGN_OR_RETURN(tok->added_,
                            AddedVocabulary::Create(std::move(added), tok->normalizer_.get()));
    tok->vocab_size_ = vocab_size;
    return absl::OkStatus();
  };
  absl::Status status;
  try {
    status = build();
  } catch (const nlohmann::json::exception& e) {
    status = absl::InvalidArgumentError(absl::StrCat("unexpected structure: ", e.what()));
  }
  if (!status.ok()) return Annotate(status, origin);
  return tok;
}

absl::Status Tokenizer::LoadConfig(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  TANDEM_ASSIGN_OR_RETURN(nlohmann::json config, ParseJson(text, path));
  try {
    if (const auto bos = ConfigTokenName(config, "bos_token")) bos_id_ = TokenToId(*bos);
    if (const auto eos = ConfigTokenName(config, "eos_token")) eos_id_ = TokenToId(*eos);
    if (json_util::Has(config, "add_bos_token")) {
      add_bos_token_ = config.at("add_bos_token").get<bool>();
    }
    if (json_util::Has(config, "chat_template")) {
      const nlohmann::json& chat = config.at("chat_template");
      if (chat.is_string()) {
        chat_template_ = chat.get<std::string>();
      } else if (chat.is_array()) {  // [{"name": "default", "template": ...}, ...]
        for (const nlohmann::json& entry : chat) {
          if (json_util::GetString(entry, "name", "") == "default") {
            chat_template_ = entry.at("template").get<std::string>();
          }
        }
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": unexpected structure: ", e.what()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                       bool add_special_tokens,
                                                       bool parse_special_tokens) const {
  if (!unicode::IsValidUtf8(text)) {
    return absl::InvalidArgumentError("text to encode is not valid UTF-8");
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const AddedSplit& split : added_->Split(text, /*normalized=*/false, parse_special_tokens)) {
    if (split.id >= 0) {
      ids.push_back(split.id);
    } else if (split.begin != split.end) {
      EncodePiece(text.substr(split.begin, split.end - split.begin), split.begin == 0,
                  parse_special_tokens, &ids);
    }
  }
  if (add_special_tokens && post_processor_ != nullptr) post_processor_->AddSpecialTokens(&ids);
  return ids;
}

void Tokenizer::EncodePiece(std::string_view text, bool at_start, bool parse_special,
                            std::vector<int32_t>* ids) const {
  std::string normalized(text);
  if (normalizer_ != nullptr) normalizer_->Normalize(&normalized);
  std::vector<PreToken> pieces;
  for (const AddedSplit& split : added_->Split(normalized, /*normalized=*/true, parse_special)) {
    if (split.id >= 0) {
      ids->push_back(split.id);
      continue;
    }
    if (split.begin == split.end) continue;
    pieces.clear();
    pieces.push_back(PreToken{normalized.substr(split.begin, split.end - split.begin),
                              at_start && split.begin == 0});
    if (pre_tokenizer_ != nullptr) pre_tokenizer_->PreTokenize(&pieces);
    for (const PreToken& piece : pieces) model_->Tokenize(piece.text, ids);
  }
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ", vocab_size_, ")"));
    }
    std::string_view token;
    if (const AddedToken* added = added_->FindById(id)) {
      token = added->content;
    } else if (const auto model_token = model_->IdToToken(id)) {
      token = *model_token;
    } else {
      continue;  // a hole in the id space
    }
    // Like HF, skipping goes by the token's text.
    if (skip_special_tokens && added_->IsSpecialContent(token)) continue;
    tokens.emplace_back(token);
  }
  std::string text;
  if (decoder_ != nullptr) {
    decoder_->DecodeChain(&tokens);
    for (const std::string& piece : tokens) text.append(piece);
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0) text.push_back(' ');
      text.append(tokens[i]);
    }
  }
  return text;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  const AddedToken* added = added_->FindById(id);
  return added != nullptr && added_->IsSpecialContent(added->content);
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (const AddedToken* added = added_->FindByContent(token)) return added->id;
  return model_->TokenToId(token);
}

std::string_view Tokenizer::IdToToken(int32_t id) const {
  if (const AddedToken* added = added_->FindById(id)) return added->content;
  return model_->IdToToken(id).value_or(std::string_view());
}

}  // namespace tandem
