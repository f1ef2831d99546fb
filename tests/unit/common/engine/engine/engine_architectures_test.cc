// Every architecture beyond Llama keeps the engine's exactness: on a small random model of each
// (written by the random-model writer, norm weights not 1), greedy tokens do not depend on
// batching, chunking, prefix caching or preemption (also with int8 and int4 weights), on
// disaggregation (one prefill engine feeding two decode engines) or on speculation, and every
// block returns to the pool.

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "common/engine/engine.h"
#include "common/engine/engine_builder.h"
#include "common/engine/model/model_writer.h"
#include "gtest/gtest.h"
#include "tests/unit/common/engine/engine/engine_test_util.h"
#include "tests/unit/common/engine/model/test_util.h"

namespace tandem {
namespace {

using testing_util::MakeRequests;
using testing_util::Req;
using testing_util::RunAll;
using Outputs = std::map<std::string, std::vector<int32_t>>;

ModelConfig SmallConfig(Architecture arch) {
  ModelConfig c;
  c.architecture = arch;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;  // q is twice as wide as hidden
  c.vocab_size = 512;
  c.max_position_embeddings = 1024;
  c.rope_theta = 1000000.0;
  c.rms_norm_eps = 1e-6;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.tie_word_embeddings = true;
  if (arch == Architecture::kPhi3) {  // LongRoPE from position 24 on, a 40-token window
    c.tie_word_embeddings = false;
    c.sliding_window = 40;
    c.rope_scaling.type = RopeScaling::Type::kLongRope;
    c.rope_scaling.original_max_position_embeddings = 24;
    c.rope_scaling.attention_factor = 1.2;
    for (int64_t i = 0; i < c.head_dim / 2; ++i) {
      c.rope_scaling.short_factor.push_back(1.0 + 0.1 * static_cast<double>(i));
      c.rope_scaling.long_factor.push_back(2.0 + 3.0 * static_cast<double>(i));
    }
  }
  if (arch == Architecture::kGemma3) {  // layer 0 local (a 20-token window), layer 1 global
    c.sliding_window = 20;
    c.sliding_layers = {1, 0};
    c.rope_local_theta = 10000.0;
    c.query_pre_attn_scalar = 24;
    c.final_logit_softcapping = 30;
  }
  if (arch == Architecture::kGemma2) {  // four layers alternating local / global (windows of 20)
    c.num_layers = 4;
    c.sliding_window = 20;
    c.sliding_layers = {1, 0, 1, 0};
    c.query_pre_attn_scalar = 24;
    c.attn_logit_softcapping = 2;
    c.final_logit_softcapping = 30;
  }
  if (IsMoe(arch)) {
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    // Qwen3-MoE and Qwen2-MoE without renormalisation
    c.norm_topk_prob = arch == Architecture::kMixtral;
    if (arch != Architecture::kMixtral) c.moe_intermediate_size = 32;
    if (arch == Architecture::kQwen2Moe) {  // Qwen2 attention (q/k/v biases), a shared expert
      c.attention_bias = true;
      c.shared_expert_intermediate_size = 48;
    }
  }
  return c;
}

class EngineArchitecturesTest : public ::testing::TestWithParam<Architecture> {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<testing_util::ScratchDir>(ArchitectureModelType(GetParam()));
    RandomModelOptions o;
    o.config = SmallConfig(GetParam());
    o.dtype = DType::kF32;
    o.seed = 3;
    o.init_std = 0.08;  // peaked enough that greedy tokens vary
    o.norm_std = 0.2;
    o.num_threads = 1;
    ASSERT_TRUE(WriteRandomModel(o, dir_->path()).ok());
  }

  std::unique_ptr<Engine> MakeEngine(EngineOptions options, int64_t blocks,
                                     const std::string& quantization = "none",
                                     bool window_kv = true) {
    EngineBuildOptions b;
    b.window_kv = window_kv;
    b.model_dir = dir_->path();
    b.quantization = quantization;
    b.quant_group_size = 32;
    b.num_kv_blocks = blocks;
    b.show_progress = false;
    b.threads = 1;
    b.engine = options;
    auto built = BuildEngine(b);
    EXPECT_TRUE(built.ok()) << built.status();
    return built.ok() ? std::move(built->engine) : nullptr;
  }

  std::unique_ptr<testing_util::ScratchDir> dir_;
};

TEST_P(EngineArchitecturesTest, BatchingChunkingCachingAndPreemptionKeepGreedyOutput) {
  const std::vector<Req> reqs = MakeRequests(16, 5, 60, 24);
  for (const std::string quantization : {"none", "int8", "int4"}) {
    EngineOptions solo_options;
    solo_options.enable_prefix_cache = false;
    solo_options.scheduler.max_num_seqs = 1;
    solo_options.scheduler.max_num_batched_tokens = 512;
    auto solo_engine = MakeEngine(solo_options, 256, quantization);
    ASSERT_NE(solo_engine, nullptr);
    const Outputs solo = RunAll(*solo_engine, reqs);
    std::set<int32_t> distinct;
    for (const auto& [id, tokens] : solo) distinct.insert(tokens.begin(), tokens.end());
    EXPECT_GT(distinct.size(), 8u) << "the model's outputs vary (a test that can fail)";
    struct Variant {
      int64_t seqs, tokens, chunk, blocks;
      bool cache;
    };
    for (const Variant& v : {Variant{16, 512, 0, 256, true}, Variant{6, 17, 0, 256, true},
                             Variant{16, 64, 5, 256, false}, Variant{16, 300, 0, 10, true}}) {
      EngineOptions o;
      o.enable_prefix_cache = v.cache;
      o.scheduler.max_num_seqs = v.seqs;
      o.scheduler.max_num_batched_tokens = v.tokens;
      o.scheduler.max_prefill_chunk = v.chunk;
      auto engine = MakeEngine(o, v.blocks, quantization);
      ASSERT_NE(engine, nullptr);
      for (int pass = 0; pass < 2; ++pass) {  // the second on a warm prefix cache
        EXPECT_EQ(RunAll(*engine, reqs), solo)
            << quantization << " seqs " << v.seqs << " tokens " << v.tokens << " pass " << pass;
        EngineStats s = engine->stats();
        EXPECT_EQ(s.kv_blocks_used, 0);
        if (v.blocks == 10) {
          EXPECT_GT(s.preemptions, 0) << "the small pool forces preemption";
        }
      }
    }
  }
}

std::map<int32_t, std::vector<int32_t>> Drain(Engine& e,
                                              std::map<int32_t, std::vector<int32_t>> out = {}) {
  while (e.HasWork()) {
    for (const auto& u : e.Step()) {
      EXPECT_TRUE(u.status.ok()) << u.status;
      out[u.index].insert(out[u.index].end(), u.new_tokens.begin(), u.new_tokens.end());
    }
  }
  return out;
}

// P computes the prompt and copies its KV layer by layer into the blocks D reserved, as a
// transport would; D continues from the first token P sampled.
std::map<int32_t, std::vector<int32_t>> RunDisaggregated(Engine& p, Engine& d,
                                                         const EngineRequest& r) {
  EngineRequest dr = r;
  dr.remote_prefill = true;
  EXPECT_TRUE(d.AddRequest(dr).ok());
  std::optional<KvReservation> reservation;
  while (!reservation.has_value()) {
    for (const auto& u : d.Step()) {
      if (u.reservation.has_value()) reservation = u.reservation;
    }
  }
  const KvCacheSpec& spec = d.backend().kv_spec();
  const size_t first_block = reservation->cached_tokens / spec.block_size;
  const size_t region = spec.bytes_per_block_layer();
  // Window layout: D reserved the local layers' pages only for the window's blocks, so only
  // those are copied (as the transport sends them); the global layers get every block.
  const int64_t n = static_cast<int64_t>(reservation->blocks.size());
  std::vector<bool> windowed(spec.num_layers, false);
  for (int64_t l : reservation->window_layers) windowed[l] = true;
  if (spec.windowed()) {
    const int64_t groups = spec.num_local_groups();
    EXPECT_EQ(static_cast<int64_t>(reservation->window_layers.size()),
              std::count_if(spec.layer_group.begin(), spec.layer_group.end(),
                            [](int32_t g) { return g > 0; }));
    const int64_t window_pages = groups * (n - reservation->window_first_block);
    if (reservation->cached_tokens == 0) {
      EXPECT_EQ(d.stats().kv_blocks_used, n + window_pages) << r.id;
      if (reservation->window_first_block > 0) {
        // Out-of-window regions of local layers are not D's: writing one is refused.
        std::vector<uint8_t> bytes(region, 1);
        EXPECT_FALSE(d.backend()
                         .WriteBlockRegion(reservation->window_layers[0], reservation->blocks[0],
                                           bytes.data())
                         .ok());
      }
    } else {  // a cached prefix brings its own window's local pages
      EXPECT_LE(d.stats().kv_blocks_used,
                n + window_pages + groups * (spec.sliding_window / spec.block_size + 2))
          << r.id;
    }
  } else {
    EXPECT_TRUE(reservation->window_layers.empty());
  }
  auto hooks = std::make_shared<KvExportHooks>();
  hooks->on_layer = [&](const std::vector<int32_t>& blocks, int64_t layer) {
    const size_t from = windowed[layer]
                            ? std::max<size_t>(first_block, reservation->window_first_block)
                            : first_block;
    for (size_t i = from; i < blocks.size(); ++i) {
      std::memcpy(d.backend().HostBlockRegion(layer, reservation->blocks[i]),
                  p.backend().HostBlockRegion(layer, blocks[i]), region);
    }
  };
  EngineRequest pr = r;
  pr.prefill_only = true;
  pr.export_hooks = hooks;
  EXPECT_TRUE(p.AddRequest(pr).ok());
  std::map<int32_t, int32_t> first;
  while (p.HasWork()) {
    for (const auto& u : p.Step()) {
      EXPECT_TRUE(u.status.ok()) << u.status;
      if (!u.new_tokens.empty()) first[u.index] = u.new_tokens[0];
    }
  }
  p.ReleaseHold(r.id);
  std::vector<int32_t> first_tokens;
  for (auto& [i, t] : first) first_tokens.push_back(t);
  EXPECT_TRUE(d.CompleteRemotePrefill(r.id, first_tokens, {}).ok());
  return Drain(d);
}

TEST_P(EngineArchitecturesTest, OnePrefillTwoDecodeEnginesEqualMonolithic) {
  auto mono = MakeEngine({}, 128), p = MakeEngine({}, 128);
  std::unique_ptr<Engine> decoders[2] = {MakeEngine({}, 128), MakeEngine({}, 128)};
  const std::vector<Req> reqs = MakeRequests(8, 21, 70, 20);
  for (size_t i = 0; i < reqs.size(); ++i) {
    for (float temperature : {0.0f, 1.0f}) {
      EngineRequest r;
      r.id = "r" + std::to_string(i) + "t" + std::to_string(temperature);
      r.prompt = reqs[i].prompt;
      r.params.max_tokens = 20;
      r.params.ignore_eos = true;
      r.params.temperature = temperature;
      r.params.seed = 9;
      ASSERT_TRUE(mono->AddRequest(r).ok());
      auto want = Drain(*mono);
      Engine& d = *decoders[i % 2];
      EXPECT_EQ(RunDisaggregated(*p, d, r), want) << r.id;
      EXPECT_EQ(d.stats().kv_blocks_used, 0);
      EXPECT_EQ(p->stats().kv_blocks_held, 0);
    }
  }
}

TEST_P(EngineArchitecturesTest, SpeculationKeepsGreedyOutput) {
  // Prompts that repeat a span, so that n-gram lookup proposes drafts.
  std::vector<Req> reqs = MakeRequests(16, 8, 12, 32);
  for (Req& r : reqs) {
    const std::vector<int32_t> span = r.prompt;
    for (int k = 0; k < 2; ++k) r.prompt.insert(r.prompt.end(), span.begin() + 1, span.end());
    r.max_tokens = 32;
  }
  EngineOptions plain;
  plain.scheduler.max_num_seqs = 16;
  auto want = RunAll(*MakeEngine(plain, 256), reqs);
  EngineOptions spec = plain;
  spec.spec.method = SpecOptions::Method::kNgram;
  spec.spec.num_speculative_tokens = 4;
  auto engine = MakeEngine(spec, 256);
  EXPECT_EQ(RunAll(*engine, reqs), want);
  EngineStats s = engine->stats();
  EXPECT_GT(s.spec_drafted_tokens, 0);
  EXPECT_EQ(s.kv_blocks_used, 0);
}

// Gemma's local layers keep only their window's KV: greedy output equals the full-KV layout's
// across batching, chunking across window boundaries, prefix caching and preemption, and the
// pages a long sequence holds stay bounded by its blocks plus one window.
TEST_P(EngineArchitecturesTest, WindowOnlyKvEqualsFullKvAndHoldsOnlyTheWindow) {
  if (!IsGemma(GetParam())) GTEST_SKIP() << "no local layers";
  const std::vector<Req> reqs = MakeRequests(16, 7, 60, 40);  // windows of 20 tokens slide
  EngineOptions solo;
  solo.enable_prefix_cache = false;
  solo.scheduler.max_num_seqs = 1;
  const Outputs want = RunAll(*MakeEngine(solo, 256, "none", /*window_kv=*/false), reqs);
  struct Variant {
    int64_t seqs, tokens, chunk, blocks;
    bool cache;
  };
  for (const Variant& v : {Variant{16, 512, 0, 256, true}, Variant{6, 17, 0, 256, true},
                           Variant{16, 64, 5, 256, false}, Variant{16, 64, 5, 256, true},
                           Variant{16, 17, 0, 16, true}}) {
    EngineOptions o;
    o.enable_prefix_cache = v.cache;
    o.scheduler.max_num_seqs = v.seqs;
    o.scheduler.max_num_batched_tokens = v.tokens;
    o.scheduler.max_prefill_chunk = v.chunk;
    auto engine = MakeEngine(o, v.blocks);
    ASSERT_NE(engine, nullptr);
    ASSERT_TRUE(engine->backend().kv_spec().windowed());
    for (int pass = 0; pass < 2; ++pass) {  // the second on a warm prefix cache
      EXPECT_EQ(RunAll(*engine, reqs), want) << "seqs " << v.seqs << " tokens " << v.tokens
                                             << " blocks " << v.blocks << " pass " << pass;
      EXPECT_EQ(engine->stats().kv_blocks_used, 0);
    }
    if (v.cache && v.blocks == 256) {  // the warm pass reused prefixes with their window pages
      EXPECT_GT(engine->stats().prefix_cache_hit, 0);
    }
    if (v.blocks == 16) {
      EXPECT_GT(engine->stats().preemptions, 0);
    }
  }

  // One long sequence: the bytes it holds grow by one layer's block per block, not two.
  auto window = MakeEngine({}, 256), full = MakeEngine({}, 256, "none", false);
  const KvCacheSpec& ws = window->backend().kv_spec();
  const KvCacheSpec& fs = full->backend().kv_spec();
  EXPECT_EQ(ws.bytes_per_block(), fs.bytes_per_block() / 2);
  EngineRequest r;
  r.id = "long";
  r.prompt = reqs[0].prompt;
  r.params.max_tokens = 200;
  r.params.ignore_eos = true;
  ASSERT_TRUE(window->AddRequest(r).ok());
  ASSERT_TRUE(full->AddRequest(r).ok());
  int64_t len = static_cast<int64_t>(r.prompt.size());
  std::vector<int32_t> got, expected;
  while (window->HasWork()) {
    for (const auto& u : window->Step())
      got.insert(got.end(), u.new_tokens.begin(), u.new_tokens.end());
    for (const auto& u : full->Step()) {
      expected.insert(expected.end(), u.new_tokens.begin(), u.new_tokens.end());
    }
    if (!window->HasWork()) break;
    len = static_cast<int64_t>(r.prompt.size() + got.size());
    const int64_t blocks = (len + ws.block_size - 1) / ws.block_size;
    // The window (20 positions) touches at most 3 blocks of 16, each one local page.
    EXPECT_LE(window->stats().kv_blocks_used, blocks + 3) << len;
    EXPECT_LE(full->stats().kv_blocks_used, blocks) << len;
    EXPECT_GE(full->stats().kv_blocks_used, blocks - 1) << len;
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ(got.size(), 200u);
  EXPECT_GT(len, 200);
}

// Phi-4-mini's partial rotary (24 of 32 dims per head, LongRoPE from position 32 on): greedy
// output does not depend on batching, chunking, prefix caching or speculation.
TEST(EngineArchitecturesPartialRotaryTest, Phi4TinyKeepsGreedyOutput) {
  testing_util::ScratchDir dir("phi4");
  RandomModelOptions o;
  o.preset = "phi4-tiny";
  o.vocab_size = 512;
  o.dtype = DType::kF32;
  o.seed = 3;
  o.init_std = 0.08;
  o.norm_std = 0.2;
  o.num_threads = 1;
  ASSERT_TRUE(WriteRandomModel(o, dir.path()).ok());
  auto make = [&](EngineOptions options) {
    EngineBuildOptions b;
    b.model_dir = dir.path();
    b.num_kv_blocks = 256;
    b.show_progress = false;
    b.threads = 1;
    b.engine = options;
    auto built = BuildEngine(b);
    EXPECT_TRUE(built.ok()) << built.status();
    return built.ok() ? std::move(built->engine) : nullptr;
  };
  std::vector<Req> reqs = MakeRequests(12, 17, 40, 24);
  for (Req& r : reqs) {  // repeats, so that n-gram lookup proposes drafts
    const std::vector<int32_t> span = r.prompt;
    r.prompt.insert(r.prompt.end(), span.begin() + 1, span.end());
  }
  EngineOptions solo;
  solo.enable_prefix_cache = false;
  solo.scheduler.max_num_seqs = 1;
  auto solo_engine = make(solo);
  ASSERT_NE(solo_engine, nullptr);
  ASSERT_EQ(solo_engine->model().config().rope_dim(), 24);
  const Outputs want = RunAll(*solo_engine, reqs);
  std::set<int32_t> distinct;
  for (const auto& [id, tokens] : want) distinct.insert(tokens.begin(), tokens.end());
  EXPECT_GT(distinct.size(), 8u);
  EngineOptions batched;
  batched.scheduler.max_num_seqs = 12;
  batched.scheduler.max_num_batched_tokens = 64;
  batched.scheduler.max_prefill_chunk = 7;
  EngineOptions spec = batched;
  spec.spec.method = SpecOptions::Method::kNgram;
  spec.spec.num_speculative_tokens = 4;
  for (const EngineOptions& options : {batched, spec}) {
    auto engine = make(options);
    for (int pass = 0; pass < 2; ++pass) EXPECT_EQ(RunAll(*engine, reqs), want) << pass;
    EXPECT_EQ(engine->stats().kv_blocks_used, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, EngineArchitecturesTest,
                         ::testing::Values(Architecture::kQwen3, Architecture::kPhi3,
                                           Architecture::kGemma3, Architecture::kGemma2,
                                           Architecture::kMixtral, Architecture::kQwen3Moe,
                                           Architecture::kQwen2Moe),
                         [](const auto& info) { return ArchitectureModelType(info.param); });

}  // namespace
}  // namespace tandem
