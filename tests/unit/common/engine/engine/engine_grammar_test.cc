// Structured output in the engine: outputs follow their constraint (greedy and sampled), end with
// `stop` when the grammar is complete, and greedy constrained output is identical across batching,
// chunked prefill, prefix caching, preemption, disaggregation, speculation and mask overlap.

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/engine/engine.h"
#include "common/engine/engine_builder.h"
#include "common/grammar/matcher.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

std::string ModelDir(const std::string& name) {
  return tandem::TestSourceDir() + "/models/" + name;
}

struct Config {
  int64_t blocks = 512;
  int64_t max_batched = 2048;
  bool prefix_cache = true;
  int64_t mask_inline_us = 2000;
  SpecOptions spec;
};

std::unique_ptr<Engine> MakeEngine(const Config& c = {}) {
  EngineBuildOptions b;
  b.model_dir = ModelDir("stories260k");
  b.num_kv_blocks = c.blocks;
  b.block_size = 16;
  b.show_progress = false;
  b.threads = 1;
  b.engine.spec = c.spec;
  b.engine.enable_prefix_cache = c.prefix_cache;
  b.engine.grammar_mask_inline_us = c.mask_inline_us;
  b.engine.scheduler.max_num_batched_tokens = c.max_batched;
  auto built = BuildEngine(b);
  EXPECT_TRUE(built.ok()) << built.status();
  return std::move(built->engine);
}

const char kSchema[] = R"({"type":"object","properties":{
    "name":{"type":"string","maxLength":10},
    "mood":{"enum":["happy","sad","angry"]},
    "friends":{"type":"array","items":{"type":"string","maxLength":6},"maxItems":3},
    "pet":{"anyOf":[{"type":"null"},{"$ref":"#/$defs/pet"}]}},
    "required":["name","mood","pet"],
    "$defs":{"pet":{"type":"object","properties":{"kind":{"enum":["cat","dog"]},
      "age":{"type":"integer","minimum":0}},"required":["kind"]}}})";

grammar::Constraint SchemaConstraint() {
  grammar::Constraint c;
  c.kind = grammar::Constraint::Kind::kJsonSchema;
  c.value = kSchema;
  return c;
}

std::vector<int32_t> Prompt(int salt) {
  std::vector<int32_t> p = {1};
  for (int i = 1; i < 6 + salt % 20; ++i) p.push_back(3 + (i * 37 + salt * 11) % 500);
  return p;
}

EngineRequest Request(int i, float temperature, const grammar::Constraint& c, int n = 1) {
  EngineRequest r;
  r.id = "r" + std::to_string(i);
  r.prompt = Prompt(i);
  r.params.max_tokens = 160;
  r.params.temperature = temperature;
  r.params.seed = 1000 + i;
  r.params.constraint = c;
  r.n = n;
  return r;
}

struct Result {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  bool operator==(const Result& o) const { return tokens == o.tokens && reason == o.reason; }
};
using Results = std::map<std::string, Result>;

// Work to step, or a constrained request waiting for its grammar off the engine loop.
bool Busy(Engine& e) {
  if (e.HasWork()) return true;
  const EngineStats s = e.stats();
  if (s.grammar_compile_waiting + s.grammar_mask_waiting == 0) return false;
  std::this_thread::sleep_for(std::chrono::microseconds(100));
  return true;
}

Results Drain(Engine& e, Results out = {}) {
  while (Busy(e)) {
    for (const auto& u : e.Step()) {
      EXPECT_TRUE(u.status.ok()) << u.status;
      Result& r = out[u.request_id + "/" + std::to_string(u.index)];
      r.tokens.insert(r.tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.finished) r.reason = u.finish_reason;
    }
  }
  return out;
}

Results RunAll(Engine& e, const std::vector<EngineRequest>& reqs) {
  for (const auto& r : reqs) EXPECT_TRUE(e.AddRequest(r).ok());
  Results out = Drain(e);
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
  return out;
}

class EngineGrammarTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tok = Tokenizer::FromModelDir(ModelDir("stories260k"));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(tok).value().release();
  }
  static std::string Text(const std::vector<int32_t>& ids) {
    std::vector<int32_t> body;
    for (int32_t t : ids) {
      if (t != 2) body.push_back(t);  // EOS
    }
    // Token bytes concatenated: what the grammar saw (Decode would strip a leading space).
    std::string out;
    for (int32_t t : body) {
      std::string piece(tokenizer_->IdToToken(t));
      if (piece.size() == 6 && piece.rfind("<0x", 0) == 0) {
        out.push_back(static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
        continue;
      }
      for (size_t k = 0; k < piece.size(); ++k) {
        if (piece.compare(k, 3, "\xE2\x96\x81") == 0) {
          out.push_back(' ');
          k += 2;
        } else {
          out.push_back(piece[k]);
        }
      }
    }
    return out;
  }
  // The document follows kSchema (checked by hand here; tests/e2e validates with jsonschema).
  static void ExpectValid(const std::string& text) {
    auto j = nlohmann::json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    ASSERT_TRUE(j.is_object()) << text;
    ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << text;
    EXPECT_LE(j["name"].get<std::string>().size(), 10u) << text;
    ASSERT_TRUE(j.contains("mood")) << text;
    const std::string mood = j["mood"];
    EXPECT_TRUE(mood == "happy" || mood == "sad" || mood == "angry") << text;
    ASSERT_TRUE(j.contains("pet")) << text;
    if (!j["pet"].is_null()) {
      EXPECT_TRUE(j["pet"]["kind"] == "cat" || j["pet"]["kind"] == "dog") << text;
    }
    if (j.contains("friends")) EXPECT_LE(j["friends"].size(), 3u) << text;
    for (const auto& [k, v] : j.items()) {
      EXPECT_TRUE(k == "name" || k == "mood" || k == "friends" || k == "pet") << text;
    }
  }
  static Tokenizer* tokenizer_;
};
Tokenizer* EngineGrammarTest::tokenizer_ = nullptr;

TEST_F(EngineGrammarTest, SampledAndGreedyOutputsFollowTheSchema) {
  auto e = MakeEngine();
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 12; ++i) reqs.push_back(Request(i, i < 2 ? 0.0f : 1.0f, SchemaConstraint()));
  reqs.push_back(Request(50, 1.0f, SchemaConstraint(), /*n=*/3));
  Results out = RunAll(*e, reqs);
  ASSERT_EQ(out.size(), 15u);
  int stopped = 0;
  for (const auto& [id, r] : out) {
    if (r.reason == FinishReason::kStop) {
      ++stopped;
      ExpectValid(Text(r.tokens));
    } else {
      EXPECT_EQ(r.reason, FinishReason::kLength) << id;
    }
  }
  EXPECT_GE(stopped, 12) << "most documents complete within max_tokens";
  EXPECT_GT(e->stats().grammar_masks, 0);
}

TEST_F(EngineGrammarTest, RegexChoiceAndGrammarConstraintsEndWithStop) {
  auto e = MakeEngine();
  grammar::Constraint re;
  re.kind = grammar::Constraint::Kind::kRegex;
  re.value = R"(\d{3}-[a-z]{2,4})";
  grammar::Constraint choice;
  choice.kind = grammar::Constraint::Kind::kChoice;
  choice.choices = {"yes", "no", "maybe later"};
  grammar::Constraint g;
  g.kind = grammar::Constraint::Kind::kGrammar;
  g.value = "root ::= \"Once \" [a-z]+ (\" \" [a-z]+){2,3} \".\"";
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    reqs.push_back(Request(i, 1.0f, re));
    reqs.push_back(Request(10 + i, 1.0f, choice));
    reqs.push_back(Request(20 + i, 1.0f, g));
  }
  Results out = RunAll(*e, reqs);
  for (int i = 0; i < 4; ++i) {
    const Result& r = out["r" + std::to_string(i) + "/0"];
    EXPECT_EQ(r.reason, FinishReason::kStop);  // the regex ends after 4 letters at most
    const std::string text = Text(r.tokens);
    ASSERT_GE(text.size(), 6u) << text;
    EXPECT_TRUE(isdigit(text[0]) && isdigit(text[1]) && isdigit(text[2]) && text[3] == '-') << text;
    const Result& c = out["r" + std::to_string(10 + i) + "/0"];
    EXPECT_EQ(c.reason, FinishReason::kStop);
    const std::string choice_text = Text(c.tokens);
    EXPECT_TRUE(choice_text == "yes" || choice_text == "no" || choice_text == "maybe later")
        << choice_text;
    const Result& gr = out["r" + std::to_string(20 + i) + "/0"];
    const std::string gtext = Text(gr.tokens);
    EXPECT_EQ(gtext.rfind("Once ", 0), 0u) << gtext;
    if (gr.reason == FinishReason::kStop) EXPECT_EQ(gtext.back(), '.') << gtext;
  }
}

TEST_F(EngineGrammarTest, BadConstraintsAreInvalidArgument) {
  auto e = MakeEngine();
  for (auto [kind, value] : std::vector<std::pair<grammar::Constraint::Kind, std::string>>{
           {grammar::Constraint::Kind::kJsonSchema, "{\"type\":"},
           {grammar::Constraint::Kind::kJsonSchema, "{\"not\":{}}"},
           {grammar::Constraint::Kind::kRegex, "(a"},
           {grammar::Constraint::Kind::kGrammar, "root ::= missing"}}) {
    grammar::Constraint c;
    c.kind = kind;
    c.value = value;
    // Compiled off the engine loop: the request is refused at once when the compile ended
    // first (a small grammar), else it ends with the compiler's error.
    absl::Status st = e->AddRequest(Request(0, 0.0f, c));
    while (st.ok() && Busy(*e)) {
      for (const auto& u : e->Step()) {
        EXPECT_TRUE(u.new_tokens.empty());
        if (u.finished) st = u.status;
      }
    }
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << value << ": " << st;
  }
  EXPECT_EQ(e->stats().grammar_invalid, 4);
  EXPECT_EQ(e->stats().kv_blocks_used, 0);
  // Still serving.
  Results out = RunAll(*e, {Request(1, 0.0f, SchemaConstraint())});
  EXPECT_EQ(out.size(), 1u);
}

// Greedy constrained output is the same in every serving mode.
TEST_F(EngineGrammarTest, GreedyIdenticalAcrossServingModes) {
  std::vector<EngineRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(Request(i, 0.0f, SchemaConstraint()));
  auto alone = [&](Config c) {
    Results all;
    for (const auto& r : reqs) {
      auto e = MakeEngine(c);
      Results one = RunAll(*e, {r});
      all.insert(one.begin(), one.end());
    }
    return all;
  };
  const Results want = alone({});
  for (const auto& [id, r] : want) {
    if (r.reason == FinishReason::kStop) ExpectValid(Text(r.tokens));
  }
  Config batched;
  EXPECT_EQ(RunAll(*MakeEngine(batched), reqs), want) << "batched";
  Config chunked;
  chunked.max_batched = 8;  // chunked prefill, few rows per step
  EXPECT_EQ(RunAll(*MakeEngine(chunked), reqs), want) << "chunked prefill";
  Config off_loop;  // every uncached mask computed by a compile worker while its sequence waits
  off_loop.mask_inline_us = 0;
  auto oe = MakeEngine(off_loop);
  EXPECT_EQ(RunAll(*oe, reqs), want) << "masks off the engine loop";
  EXPECT_GT(oe->stats().grammar_masks_deferred, 0);
  {
    Config cached;  // the same prompts twice: the second round hits the prefix cache
    auto e = MakeEngine(cached);
    RunAll(*e, reqs);
    EXPECT_EQ(RunAll(*e, reqs), want) << "prefix cache";
  }
  Config tight;
  tight.blocks = 14;  // preemption: sequences are recomputed, the matcher state is kept
  tight.prefix_cache = false;
  auto te = MakeEngine(tight);
  EXPECT_EQ(RunAll(*te, reqs), want) << "preemption";
  EXPECT_GT(te->stats().preemptions, 0);
  Config ngram;
  ngram.spec.method = SpecOptions::Method::kNgram;
  ngram.spec.num_speculative_tokens = 4;
  EXPECT_EQ(RunAll(*MakeEngine(ngram), reqs), want) << "n-gram speculation";
  Config draft;
  draft.spec.method = SpecOptions::Method::kDraft;
  draft.spec.draft_model_dir = ModelDir("llama2xs-280k");
  draft.spec.num_speculative_tokens = 3;
  draft.spec.adaptive = false;
  auto de = MakeEngine(draft);
  EXPECT_EQ(RunAll(*de, reqs), want) << "draft-model speculation";
  EXPECT_GT(de->stats().spec_accepted_tokens, 0);
}

// Disaggregated: the prefill engine samples the first token under the constraint and the decode
// engine continues the same matcher state.
TEST_F(EngineGrammarTest, DisaggregationCarriesTheConstraint) {
  auto mono = MakeEngine(), p = MakeEngine(), d = MakeEngine();
  for (float temperature : {0.0f, 1.0f}) {
    EngineRequest r = Request(temperature == 0 ? 7 : 8, temperature, SchemaConstraint());
    Results want = RunAll(*mono, {r});
    EngineRequest dr = r;
    dr.remote_prefill = true;
    ASSERT_TRUE(d->AddRequest(dr).ok());
    std::optional<KvReservation> res;
    while (!res.has_value()) {
      for (const auto& u : d->Step()) {
        if (u.reservation.has_value()) res = u.reservation;
      }
    }
    const size_t first_block = res->cached_tokens / res->block_size;
    const size_t region = p->backend().kv_spec().bytes_per_block_layer();
    auto hooks = std::make_shared<KvExportHooks>();
    hooks->on_layer = [&](const std::vector<int32_t>& blocks, int64_t layer) {
      for (size_t i = first_block; i < blocks.size(); ++i) {
        std::memcpy(d->backend().HostBlockRegion(layer, res->blocks[i]),
                    p->backend().HostBlockRegion(layer, blocks[i]), region);
      }
    };
    EngineRequest pr = r;
    pr.prefill_only = true;
    pr.export_hooks = hooks;
    ASSERT_TRUE(p->AddRequest(pr).ok());
    std::vector<int32_t> first;
    while (Busy(*p)) {
      for (const auto& u : p->Step())
        first.insert(first.end(), u.new_tokens.begin(), u.new_tokens.end());
    }
    p->ReleaseHold(r.id);
    ASSERT_EQ(first.size(), 1u);
    // A first token outside the grammar is refused.
    EXPECT_EQ(
        d->CompleteRemotePrefill(r.id, {tokenizer_->TokenToId("▁the").value_or(3)}, {}).code(),
        absl::StatusCode::kInvalidArgument);
    ASSERT_TRUE(d->CompleteRemotePrefill(r.id, first, {}).ok());
    Results got = Drain(*d);
    ASSERT_EQ(got.size(), 1u);
    got.begin()->second.tokens.insert(got.begin()->second.tokens.begin(), 0);  // align below
    std::vector<int32_t> got_tokens(got.begin()->second.tokens.begin() + 1,
                                    got.begin()->second.tokens.end());
    EXPECT_EQ(got_tokens, want.begin()->second.tokens) << "temperature " << temperature;
    EXPECT_EQ(got.begin()->second.reason, want.begin()->second.reason);
  }
}

// Migration: a request resumed with prior output continues the grammar from there; prior output
// outside the grammar is refused.
TEST_F(EngineGrammarTest, MigrationRebuildsTheMatcher) {
  auto e = MakeEngine();
  EngineRequest r = Request(3, 0.0f, SchemaConstraint());
  Results want = RunAll(*e, {r});
  const std::vector<int32_t>& all = want.begin()->second.tokens;
  ASSERT_GT(all.size(), 5u);
  EngineRequest resumed = r;
  resumed.prior_output.assign(all.begin(), all.begin() + 5);
  Results got = RunAll(*e, {resumed});
  std::vector<int32_t> joined(all.begin(), all.begin() + 5);
  joined.insert(joined.end(), got.begin()->second.tokens.begin(), got.begin()->second.tokens.end());
  EXPECT_EQ(joined, all);
  EngineRequest bad = r;
  bad.prior_output = {tokenizer_->TokenToId("▁the").value_or(3)};
  EXPECT_EQ(e->AddRequest(bad).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
