#include "common/tokenizer/tokenizer_json.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

using Json = nlohmann::json;

// SAX handler: builds the DOM through nlohmann's own DOM builder, except for model.vocab and
// model.merges, which it collects into BpeVocabData (leaving null in the DOM).
class Handler {
 public:
  explicit Handler(ParsedTokenizerJson* out) : out_(out), dom_(out->json, true) {}

  bool null() {
    return Scalar([&] { return dom_.null(); });
  }
  bool boolean(bool v) {
    return Scalar([&] { return dom_.boolean(v); });
  }
  bool number_integer(Json::number_integer_t v) {
    if (mode_ == Mode::kVocab) return AddVocab(v);
    return Scalar([&] { return dom_.number_integer(v); });
  }
  bool number_unsigned(Json::number_unsigned_t v) {
    if (mode_ == Mode::kVocab) return AddVocab(static_cast<int64_t>(v));
    return Scalar([&] { return dom_.number_unsigned(v); });
  }
  bool number_float(Json::number_float_t v, const Json::string_t& s) {
    return Scalar([&] { return dom_.number_float(v, s); });
  }
  bool string(Json::string_t& v) {
    if (mode_ == Mode::kMerges) {
      if (merge_depth_ == 0) return AddLegacyMerge(v);
      if (pair_size_ == 2) return Fail("a merge pair has more than two strings");
      pair_[pair_size_++] = BpeVocabData::Add(v, &out_->bpe.merge_strings);
      return true;
    }
    return Scalar([&] { return dom_.string(v); });
  }
  bool binary(Json::binary_t& v) {
    return Scalar([&] { return dom_.binary(v); });
  }

  bool start_object(std::size_t n) {
    if (mode_ != Mode::kDom) return Fail("unexpected object in model.vocab/merges");
    if (AtModelKey("vocab")) {
      mode_ = Mode::kVocab;
      out_->bpe.has_vocab = true;
      return true;
    }
    frames_.push_back(Frame{true, {}});
    return dom_.start_object(n);
  }
  bool key(Json::string_t& k) {
    if (mode_ == Mode::kVocab) {
      vocab_key_ = std::move(k);
      return true;
    }
    if (mode_ != Mode::kDom) return Fail("unexpected key in model.merges");
    frames_.back().key = k;
    return dom_.key(k);
  }
  bool end_object() {
    if (mode_ == Mode::kVocab) {
      mode_ = Mode::kDom;
      return dom_.null();
    }
    frames_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    if (mode_ == Mode::kMerges) {
      if (merge_depth_ != 0) return Fail("nested array in model.merges");
      merge_depth_ = 1;
      pair_size_ = 0;
      return true;
    }
    if (mode_ != Mode::kDom) return Fail("unexpected array in model.vocab");
    if (AtModelKey("merges")) {
      mode_ = Mode::kMerges;
      merge_depth_ = 0;
      out_->bpe.has_merges = true;
      return true;
    }
    frames_.push_back(Frame{false, {}});
    return dom_.start_array(n);
  }
  bool end_array() {
    if (mode_ == Mode::kMerges) {
      if (merge_depth_ == 1) {
        merge_depth_ = 0;
        if (pair_size_ != 2) return Fail("a merge pair must have two strings");
        out_->bpe.merges.push_back({pair_[0], pair_[1]});
        return true;
      }
      mode_ = Mode::kDom;
      return dom_.null();
    }
    frames_.pop_back();
    return dom_.end_array();
  }
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& e) {
    return Fail(e.what());
  }

  const std::string& error() const { return error_; }

 private:
  enum class Mode { kDom, kVocab, kMerges };
  struct Frame {
    bool is_object;
    std::string key;
  };

  // True when the value about to start is the top-level object's "model" member's `name`.
  bool AtModelKey(const char* name) const {
    return frames_.size() == 2 && frames_[0].is_object && frames_[0].key == "model" &&
           frames_[1].is_object && frames_[1].key == name;
  }
  template <typename F>
  bool Scalar(F&& f) {
    if (mode_ != Mode::kDom) return Fail("unexpected value in model.vocab/merges");
    return f();
  }
  bool AddVocab(int64_t id) {
    out_->bpe.vocab.push_back({BpeVocabData::Add(vocab_key_, &out_->bpe.vocab_strings), id});
    return true;
  }
  bool AddLegacyMerge(const std::string& merge) {
    const size_t space = merge.find(' ');
    if (space == std::string::npos) {
      return Fail(absl::StrCat("merge '", merge, "' is not of the form 'a b'"));
    }
    const std::string_view view(merge);
    std::string* buffer = &out_->bpe.merge_strings;
    const BpeVocabData::Piece left = BpeVocabData::Add(view.substr(0, space), buffer);
    out_->bpe.merges.push_back({left, BpeVocabData::Add(view.substr(space + 1), buffer)});
    return true;
  }
  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }

  ParsedTokenizerJson* out_;
  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  std::vector<Frame> frames_;
  Mode mode_ = Mode::kDom;
  std::string vocab_key_;
  int merge_depth_ = 0;
  BpeVocabData::Piece pair_[2] = {};
  int pair_size_ = 0;
  std::string error_;
};

}  // namespace

absl::StatusOr<ParsedTokenizerJson> ParseTokenizerJson(std::string_view text,
                                                       const std::string& origin) {
  ParsedTokenizerJson parsed;
  Handler handler(&parsed);
  bool ok = false;
  try {
    ok = Json::sax_parse(text.begin(), text.end(), &handler);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": invalid JSON: ", e.what()));
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": invalid JSON: ", handler.error()));
  }
  return parsed;
}

}  // namespace tandem
