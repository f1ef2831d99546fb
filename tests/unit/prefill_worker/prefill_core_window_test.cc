// Disaggregated serving of a model whose sliding-window layers alternate with global ones (a
// small random Gemma 2: layers 0 and 2 local, windows of 20 tokens): the decode worker reserves
// the local layers' pages only for the window's blocks and tells the prefill worker so in its
// reservation (window_layers, window_first); the prefill worker sends the local layers only
// there (tcp and loopback). Greedy tokens equal a plain engine's, the decode side holds only the
// window's local pages, and a target whose window differs from the model's is refused.

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/cluster/transfer_key.h"
#include "common/engine/engine_builder.h"
#include "common/engine/model/model_writer.h"
#include "decode_worker/decode_core.h"
#include "gtest/gtest.h"
#include "prefill_worker/prefill_core.h"
#include "tests/unit/common/engine/model/test_util.h"
#include "tests/unit/common/worker/worker_test_util.h"

namespace tandem {
namespace {

using testing::DecodeStream;
using testing::WaitForStats;

constexpr int64_t kBlockSize = 16;
constexpr int kPromptLen = 100;  // blocks 0..6; a query at position 100 sees blocks 5 and 6

ModelConfig GemmaConfig() {
  ModelConfig c;
  c.architecture = Architecture::kGemma2;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  c.vocab_size = 512;
  c.max_position_embeddings = 1024;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-6;
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.tie_word_embeddings = true;
  c.sliding_window = 20;
  c.sliding_layers = {1, 0, 1, 0};
  c.query_pre_attn_scalar = 24;
  c.attn_logit_softcapping = 2;
  c.final_logit_softcapping = 30;
  return c;
}

std::vector<int32_t> LongPrompt() {
  std::vector<int32_t> p = {1};
  for (int i = 1; i < kPromptLen; ++i) p.push_back(3 + (i * 53) % 500);
  return p;
}

struct PrefillResult {
  absl::Status status;
  v1::PrefillResponse response;
};

class WindowDisaggregatedTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<::tandem::testing_util::ScratchDir>("gemma2");
    RandomModelOptions o;
    o.config = GemmaConfig();
    o.dtype = DType::kF32;
    o.seed = 5;
    o.init_std = 0.08;
    o.norm_std = 0.2;
    o.num_threads = 1;
    ASSERT_TRUE(WriteRandomModel(o, dir_->path()).ok());
    p_ = Start();
    d_ = Start();
    decode_ = std::make_unique<DecodeCore>(d_.engine.get());
    kvtransfer::ReceiverOptions ro;
    ro.transport = GetParam();
    ro.layout = d_.layout;
    ro.faults_from_env = false;
    ASSERT_TRUE(decode_->StartReceiver(ro, d_.regions.get()).ok());
    prefill_ = std::make_unique<PrefillCore>(p_.engine.get(), kBlockSize);
    kvtransfer::SenderOptions so;
    so.transport = GetParam();
    so.layout = p_.layout;
    so.faults_from_env = false;
    ASSERT_TRUE(prefill_->StartSender(so, p_.regions.get()).ok());
  }
  void TearDown() override {
    prefill_.reset();
    decode_.reset();
  }

  std::unique_ptr<Engine> Build(bool window_kv = true) {
    EngineBuildOptions b;
    b.window_kv = window_kv;
    b.model_dir = dir_->path();
    b.num_kv_blocks = 64;
    b.show_progress = false;
    b.threads = 1;
    auto built = BuildEngine(b);
    EXPECT_TRUE(built.ok()) << built.status();
    return built.ok() ? std::move(built->engine) : nullptr;
  }
  testing::RunningEngine Start(bool window_kv = true) {
    std::unique_ptr<Engine> e = Build(window_kv);
    testing::RunningEngine r;
    r.backend = &e->backend();
    r.layout = LayoutOf(*r.backend, e->model().model_id());
    r.regions = std::make_unique<BackendRegions>(r.backend);
    r.engine = std::make_unique<AsyncEngine>(std::move(e));
    return r;
  }
  // Greedy tokens of a plain (monolithic) engine.
  std::vector<int32_t> Reference(int32_t max_tokens) {
    std::unique_ptr<Engine> e = Build();
    EngineRequest r;
    r.id = "reference";
    r.prompt = LongPrompt();
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    r.params.temperature = 0;
    EXPECT_TRUE(e->AddRequest(r).ok());
    std::vector<int32_t> out;
    while (e->HasWork()) {
      for (const auto& u : e->Step())
        out.insert(out.end(), u.new_tokens.begin(), u.new_tokens.end());
    }
    return out;
  }

  static v1::DecodeRequest DecodeRequest(const std::string& id, int32_t max_tokens) {
    v1::DecodeRequest r;
    r.set_request_id(id);
    for (int32_t t : LongPrompt()) r.add_prompt_token_ids(t);
    *r.mutable_sampling() = testing::Greedy(max_tokens);
    r.set_remote_prefill(true);
    return r;
  }
  static v1::PrefillRequest PrefillRequest(const v1::DecodeRequest& decode,
                                           const v1::KvReservation& reservation) {
    v1::PrefillRequest r;
    r.set_request_id(decode.request_id());
    *r.mutable_prompt_token_ids() = decode.prompt_token_ids();
    *r.mutable_sampling() = decode.sampling();
    *r.mutable_target() = reservation;
    r.mutable_target()->set_transfer_key(TransferAttemptKey(reservation.transfer_key(), 0));
    return r;
  }
  PrefillResult Prefill(const v1::PrefillRequest& request) {
    std::promise<PrefillResult> result;
    prefill_->Prefill(request, [&](const absl::Status& st, const v1::PrefillResponse& r) {
      result.set_value({st, r});
    });
    auto f = result.get_future();
    EXPECT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    return f.get();
  }

  std::unique_ptr<::tandem::testing_util::ScratchDir> dir_;
  testing::RunningEngine p_;
  testing::RunningEngine d_;
  std::unique_ptr<DecodeCore> decode_;
  std::unique_ptr<PrefillCore> prefill_;
};

TEST_P(WindowDisaggregatedTest, DecodeReservesAndReceivesOnlyTheWindowOfLocalLayers) {
  ASSERT_TRUE(d_.backend->kv_spec().windowed());
  ASSERT_EQ(d_.backend->kv_spec().num_local_groups(), 1);
  const v1::DecodeRequest request = DecodeRequest("long", 16);
  DecodeStream stream;
  decode_->Decode(request, stream.Callback());
  ASSERT_TRUE(stream.WaitFor([](const v1::DecodeResponse& r) { return r.has_reservation(); }));
  const v1::KvReservation reservation = *stream.Reservation();
  ASSERT_EQ(reservation.dst_blocks_size(), 7);
  EXPECT_EQ(
      std::vector<int32_t>(reservation.window_layers().begin(), reservation.window_layers().end()),
      (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(reservation.window_first(), 5);
  // 7 blocks of the global layers plus the local group's pages of blocks 5 and 6 only (the whole
  // prompt's would be 14).
  EXPECT_TRUE(WaitForStats(*d_.engine, [](const EngineStats& s) { return s.kv_blocks_used == 9; }))
      << d_.engine->stats().kv_blocks_used;

  const PrefillResult prefill = Prefill(PrefillRequest(request, reservation));
  ASSERT_TRUE(prefill.status.ok()) << prefill.status;
  ASSERT_TRUE(stream.WaitForFinal());
  EXPECT_EQ(stream.Tokens(), Reference(16));
  // Global layers 1, 3: 7 blocks each; local layers 0, 2: blocks 5 and 6.
  const int64_t regions = 2 * 7 + 2 * 2;
  EXPECT_EQ(decode_->receiver()->stats().bytes, regions * d_.layout.region_bytes());
  EXPECT_TRUE(WaitForStats(*d_.engine, [](const EngineStats& s) { return s.kv_blocks_used == 0; }));
  EXPECT_TRUE(WaitForStats(*p_.engine, [](const EngineStats& s) {
    return s.kv_blocks_used == 0 && s.kv_blocks_held == 0;
  }));
  EXPECT_EQ(decode_->transfers_in_flight(), 0);
}

TEST_P(WindowDisaggregatedTest, ATargetWhoseWindowDiffersFromTheModelsIsRefused) {
  const v1::DecodeRequest request = DecodeRequest("bad-window", 4);
  DecodeStream stream;
  decode_->Decode(request, stream.Callback());
  ASSERT_TRUE(stream.WaitFor([](const v1::DecodeResponse& r) { return r.has_reservation(); }));
  const v1::KvReservation good = *stream.Reservation();
  struct Case {
    const char* field;
    void (*mutate)(v1::KvReservation*);
  };
  const Case cases[] = {
      {"window_first", [](v1::KvReservation* t) { t->set_window_first(4); }},
      {"window_first", [](v1::KvReservation* t) { t->set_window_first(-3); }},
      {"window_first", [](v1::KvReservation* t) { t->set_window_first(1 << 30); }},
      {"window_layers", [](v1::KvReservation* t) { t->add_window_layers(1); }},
      {"window_layers", [](v1::KvReservation* t) { t->set_window_layers(1, 99); }},
      {"window_layers", [](v1::KvReservation* t) { t->set_window_layers(0, -1); }},
  };
  for (const Case& c : cases) {
    v1::KvReservation bad = good;
    c.mutate(&bad);
    const PrefillResult refused = Prefill(PrefillRequest(request, bad));
    EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument) << refused.status;
    EXPECT_NE(refused.status.message().find(c.field), std::string::npos) << refused.status;
  }
  EXPECT_EQ(p_.engine->stats().prompt_tokens, 0);  // the engine never saw them
  // The right target still works afterwards.
  const PrefillResult ok = Prefill(PrefillRequest(request, good));
  ASSERT_TRUE(ok.status.ok()) << ok.status;
  ASSERT_TRUE(stream.WaitForFinal());
  EXPECT_EQ(stream.Tokens(), Reference(4));
}

// A prefill worker whose pool keeps every block of every layer (no window layout) holds the
// window too: it sends what the decode worker's reservation asks for.
TEST_P(WindowDisaggregatedTest, APrefillWorkerWithoutTheWindowLayoutSendsTheWindow) {
  testing::RunningEngine full = Start(/*window_kv=*/false);
  ASSERT_FALSE(full.backend->kv_spec().windowed());
  PrefillCore core(full.engine.get(), kBlockSize);
  kvtransfer::SenderOptions so;
  so.transport = GetParam();
  so.layout = full.layout;
  so.faults_from_env = false;
  ASSERT_TRUE(core.StartSender(so, full.regions.get()).ok());
  const v1::DecodeRequest request = DecodeRequest("mixed", 12);
  DecodeStream stream;
  decode_->Decode(request, stream.Callback());
  ASSERT_TRUE(stream.WaitFor([](const v1::DecodeResponse& r) { return r.has_reservation(); }));
  v1::KvReservation target = *stream.Reservation();
  ASSERT_EQ(target.window_first(), 5);
  std::promise<absl::Status> done;
  core.Prefill(PrefillRequest(request, target),
               [&](const absl::Status& st, const v1::PrefillResponse&) { done.set_value(st); });
  auto f = done.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
  ASSERT_TRUE(f.get().ok());
  ASSERT_TRUE(stream.WaitForFinal());
  EXPECT_EQ(stream.Tokens(), Reference(12));
  // A structurally bad window is refused all the same.
  target.set_window_first(target.dst_blocks_size() + 1);
  std::promise<absl::Status> refused;
  core.Prefill(PrefillRequest(request, target),
               [&](const absl::Status& st, const v1::PrefillResponse&) { refused.set_value(st); });
  const absl::Status st = refused.get_future().get();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("window_first"), std::string::npos) << st;
}

INSTANTIATE_TEST_SUITE_P(Transports, WindowDisaggregatedTest, ::testing::Values("tcp", "loopback"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tandem
