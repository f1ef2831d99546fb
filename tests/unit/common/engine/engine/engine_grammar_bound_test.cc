// A grammar whose parser states outgrow their bound: the engine ends that request with
// RESOURCE_EXHAUSTED naming the bound and keeps serving the other requests in the batch.

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "common/engine/engine.h"
#include "common/engine/engine_builder.h"
#include "common/grammar/grammar_compiler.h"
#include "common/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

// Work to step, or a constrained request waiting for its grammar off the engine loop.
bool Busy(Engine& e) {
  if (e.HasWork()) return true;
  const EngineStats s = e.stats();
  if (s.grammar_compile_waiting + s.grammar_mask_waiting == 0) return false;
  std::this_thread::sleep_for(std::chrono::microseconds(100));
  return true;
}

TEST(EngineGrammarBoundTest, HostileGrammarFailsAloneAndTheEngineKeepsServing) {
  const std::string dir = tandem::TestSourceDir() + "/models/stories260k";
  auto tok = Tokenizer::FromModelDir(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto vocab = grammar::TokenVocab::FromTokenizer(**tok);
  ASSERT_TRUE(vocab.ok());
  grammar::CompiledGrammarOptions bounds;
  bounds.max_graph_bytes = 1 << 20;
  EngineBuildOptions b;
  b.model_dir = dir;
  b.num_kv_blocks = 256;
  b.block_size = 16;
  b.show_progress = false;
  b.threads = 1;
  b.engine.grammar =
      std::make_shared<grammar::GrammarCompiler>(*vocab, 16, grammar::GrammarLimits{}, bounds);
  auto built = BuildEngine(b);
  ASSERT_TRUE(built.ok()) << built.status();
  Engine& e = *built->engine;

  auto request = [](const std::string& id, grammar::Constraint::Kind kind, const std::string& v) {
    EngineRequest r;
    r.id = id;
    r.prompt = {1, 40, 50, 60};
    r.params.max_tokens = 400;
    r.params.temperature = 1.0f;
    r.params.seed = 3;
    r.params.constraint.kind = kind;
    r.params.constraint.value = v;
    return r;
  };
  // Exponentially ambiguous: every prefix is a new, larger Earley set.
  ASSERT_TRUE(e.AddRequest(request("hostile", grammar::Constraint::Kind::kGrammar,
                                   R"(root ::= x
                                      x ::= x x | [a-z] | " ")"))
                  .ok());
  ASSERT_TRUE(
      e.AddRequest(request("fine", grammar::Constraint::Kind::kRegex, "[a-z ]{1,40}\\.")).ok());
  std::map<std::string, absl::Status> status;
  std::map<std::string, FinishReason> reason;
  while (Busy(e)) {
    for (const auto& u : e.Step()) {
      if (!u.finished) continue;
      status[u.request_id] = u.status;
      reason[u.request_id] = u.finish_reason;
    }
  }
  EXPECT_EQ(reason["hostile"], FinishReason::kError);
  EXPECT_EQ(status["hostile"].code(), absl::StatusCode::kResourceExhausted) << status["hostile"];
  EXPECT_NE(status["hostile"].message().find("1 MiB"), std::string::npos) << status["hostile"];
  EXPECT_TRUE(status["fine"].ok()) << status["fine"];
  EXPECT_EQ(reason["fine"], FinishReason::kStop);

  // The engine still serves new requests.
  ASSERT_TRUE(e.AddRequest(request("again", grammar::Constraint::Kind::kRegex, "[0-9]{3}")).ok());
  while (Busy(e)) {
    for (const auto& u : e.Step()) {
      if (u.finished) status[u.request_id] = u.status;
    }
  }
  EXPECT_TRUE(status["again"].ok()) << status["again"];
}

}  // namespace
}  // namespace tandem
