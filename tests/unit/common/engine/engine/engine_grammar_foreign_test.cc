// Tokens the engine did not sample, under a grammar one of whose masks is being computed off the
// loop (the worker then holds the grammar's state graph): a prefill worker's first tokens and a
// migrated request's prior output wait with their sequence held, while other requests keep
// stepping with short steps; no engine call waits for the worker, and every output is the one
// the request produces alone.
//
// The worker's computation is made long here by holding the grammar's state graph from another
// thread (as a long mask computation does) while the engine's real deferred mask task waits for
// it; the holder lets go after kHoldLimit at the latest, so code that does wait fails the timing
// checks instead of hanging.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/engine/engine.h"
#include "common/engine/engine_builder.h"
#include "common/grammar/compile_service.h"
#include "common/grammar/matcher.h"
#include "gtest/gtest.h"
#include "tests/unit/common/engine/engine/blockable_compile_service.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

const std::string kModel = tandem::TestSourceDir() + "/models/stories260k";
constexpr auto kHoldLimit = std::chrono::seconds(4);
// What one call into the engine may take while the graph is held (a step of this model takes
// milliseconds; the margin is for a loaded machine).
constexpr double kMaxCallSeconds = 1.0;

std::shared_ptr<grammar::GrammarCompiler> Compiler() {
  auto c = LoadGrammarCompiler(kModel);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Every uncached mask is computed off the loop (grammar_mask_inline_us = 0) when `service` is
// given; without one, the engine compiles its own and computes masks inline (the reference).
std::unique_ptr<Engine> MakeEngine(std::shared_ptr<grammar::GrammarCompileService> service) {
  EngineBuildOptions b;
  b.model_dir = kModel;
  b.num_kv_blocks = 256;
  b.block_size = 16;
  b.show_progress = false;
  b.threads = 1;
  b.engine.grammar = service != nullptr ? nullptr : Compiler();
  b.engine.grammar_mask_inline_us = service != nullptr ? 0 : 2000;
  b.engine.grammar_service = std::move(service);
  auto built = BuildEngine(b);
  EXPECT_TRUE(built.ok()) << built.status();
  return std::move(built->engine);
}

struct Service : BlockableCompileService {
  Service() : BlockableCompileService(Compiler(), 10000) {}
  // The compiled grammar of `c` (compiled already: answered from the cache).
  std::shared_ptr<const grammar::CompiledGrammar> Compiled(const grammar::Constraint& c) {
    auto h = service->Submit("test", c);
    EXPECT_TRUE(h->ready() && h->result().ok());
    return *h->result();
  }
};

// Holds a grammar's state graph on its own thread until Release (or kHoldLimit).
class GraphHolder {
 public:
  explicit GraphHolder(std::shared_ptr<const grammar::CompiledGrammar> g) : g_(std::move(g)) {
    thread_ = std::thread([this] {
      std::lock_guard<std::mutex> graph(g_->graph().mu());
      std::unique_lock<std::mutex> lock(mu_);
      held_ = true;
      cv_.notify_all();
      cv_.wait_for(lock, kHoldLimit, [this] { return released_; });
    });
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return held_; });
  }
  ~GraphHolder() { Release(); }
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      released_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::shared_ptr<const grammar::CompiledGrammar> g_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false;
  bool released_ = false;
};

grammar::Constraint Regex(const std::string& value) {
  grammar::Constraint c;
  c.kind = grammar::Constraint::Kind::kRegex;
  c.value = value;
  return c;
}

// A small regex, distinct per test (`k` dots at its end).
std::string Digits(int k) { return R"(\d{3}-[a-z]{2,6})" + std::string(k, '.'); }

EngineRequest Request(const std::string& id, int salt, const grammar::Constraint& c = {}) {
  EngineRequest r;
  r.id = id;
  r.prompt = {1};
  for (int i = 0; i < 20; ++i) r.prompt.push_back(3 + (salt * 31 + i * 17) % 500);
  r.params.max_tokens = 24;
  r.params.temperature = 0;
  r.params.constraint = c;
  r.tenant = "t";
  if (!c.active()) {
    r.params.ignore_eos = true;
    r.params.max_tokens = 64;
  }
  return r;
}

struct Out {
  std::vector<int32_t> tokens;
  bool finished = false;
  absl::Status status;
  std::optional<KvReservation> reservation;
};
using Outs = std::map<std::string, Out>;

void Collect(const std::vector<SequenceUpdate>& updates, Outs* out) {
  for (const auto& u : updates) {
    Out& o = (*out)[u.request_id];
    o.tokens.insert(o.tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
    if (u.reservation.has_value()) o.reservation = u.reservation;
    if (u.finished) {
      o.finished = true;
      o.status = u.status;
    }
  }
}

// Steps (sleeping while everything waits off the loop, as AsyncEngine does) until `done`.
template <typename Done>
void StepUntil(Engine& e, Outs* out, Done done) {
  for (int i = 0; i < 100000 && !done(); ++i) {
    if (e.HasWork()) {
      Collect(e.Step(), out);
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  ASSERT_TRUE(done());
}

void Drain(Engine& e, Outs* out) {
  StepUntil(e, out, [&] {
    const EngineStats s = e.stats();
    return !e.HasWork() && s.grammar_compile_waiting + s.grammar_mask_waiting == 0;
  });
}

// Steps while there is work (nothing off the loop awaited); the longest step, in seconds.
double StepWhileWork(Engine& e, Outs* out) {
  double longest = 0;
  for (int i = 0; i < 1000 && e.HasWork(); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    Collect(e.Step(), out);
    longest = std::max(
        longest, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return longest;
}

template <typename F>
double Seconds(F f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Out Solo(const EngineRequest& r) {
  auto e = MakeEngine(nullptr);
  EXPECT_TRUE(e->AddRequest(r).ok());
  Outs out;
  Drain(*e, &out);
  return out[r.id];
}

// `a` (on `e`, constrained) has a mask of its grammar computed off the loop, in flight and
// holding the grammar's state graph (held by `holder` in the worker's stead) when this returns.
std::unique_ptr<GraphHolder> BusyGrammar(Service& s, Engine& e, const EngineRequest& a, Outs* out) {
  StepUntil(e, out, [&] { return !(*out)[a.id].tokens.empty(); });
  s.Block();  // the next state's mask queues behind the blocker
  StepUntil(e, out, [&] { return e.stats().grammar_mask_waiting == 1; });
  auto holder = std::make_unique<GraphHolder>(s.Compiled(a.params.constraint));
  s.Unblock();  // the worker takes the mask task and waits for the graph
  return holder;
}

// The prompt's KV of `r` computed by a prefill-role engine into `d`'s reservation; the first
// tokens that engine sampled.
std::vector<int32_t> Prefill(Engine& p, Engine& d, const EngineRequest& r,
                             const KvReservation& reservation) {
  const size_t first_block = reservation.cached_tokens / p.backend().kv_spec().block_size;
  const size_t region = p.backend().kv_spec().bytes_per_block_layer();
  auto hooks = std::make_shared<KvExportHooks>();
  hooks->on_layer = [&](const std::vector<int32_t>& blocks, int64_t layer) {
    for (size_t i = first_block; i < blocks.size(); ++i) {
      std::memcpy(d.backend().HostBlockRegion(layer, reservation.blocks[i]),
                  p.backend().HostBlockRegion(layer, blocks[i]), region);
    }
  };
  EngineRequest pr = r;
  pr.prefill_only = true;
  pr.export_hooks = hooks;
  EXPECT_TRUE(p.AddRequest(pr).ok());
  Outs out;
  Drain(p, &out);
  p.ReleaseHold(r.id);
  EXPECT_TRUE(out[r.id].status.ok()) << out[r.id].status;
  return out[r.id].tokens;
}

// A remote-prefill request reserved on `d`: its reservation.
KvReservation Reserve(Engine& d, const EngineRequest& r, Outs* out) {
  EngineRequest dr = r;
  dr.remote_prefill = true;
  EXPECT_TRUE(d.AddRequest(dr).ok());
  StepUntil(d, out, [&] { return (*out)[r.id].reservation.has_value(); });
  return *(*out)[r.id].reservation;
}

TEST(EngineGrammarForeignTest, AFirstTokenWaitsForItsBusyGrammarWhileOthersStep) {
  Service s;
  auto d = MakeEngine(s.service), p = MakeEngine(s.service);
  const grammar::Constraint g = Regex(Digits(21));
  const EngineRequest r = Request("r", 7, g), a = Request("a", 4, g), q = Request("q", 5);
  Outs out;
  const KvReservation reservation = Reserve(*d, r, &out);
  const std::vector<int32_t> first = Prefill(*p, *d, r, reservation);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_TRUE(d->AddRequest(a).ok());
  ASSERT_TRUE(d->AddRequest(q).ok());
  auto holder = BusyGrammar(s, *d, a, &out);

  absl::Status st;
  EXPECT_LT(Seconds([&] { st = d->CompleteRemotePrefill(r.id, first, {}); }), kMaxCallSeconds)
      << "the first token's check waited for the grammar's mask computation";
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_LT(StepWhileWork(*d, &out), kMaxCallSeconds);
  EXPECT_TRUE(out[q.id].finished) << "the other request kept stepping to its end";
  EXPECT_TRUE(out[r.id].tokens.empty()) << "its first token waits for the grammar";
  EXPECT_EQ(d->stats().num_awaiting_kv, 1);
  EXPECT_EQ(d->CompleteRemotePrefill(r.id, first, {}).code(), absl::StatusCode::kFailedPrecondition)
      << "a second completion while the first waits";

  holder->Release();
  Drain(*d, &out);
  for (const EngineRequest& x : {r, a, q}) {
    EXPECT_TRUE(out[x.id].finished) << x.id;
    EXPECT_TRUE(out[x.id].status.ok()) << x.id << ": " << out[x.id].status;
    EXPECT_EQ(out[x.id].tokens, Solo(x).tokens) << x.id;
  }
  const EngineStats end = d->stats();
  EXPECT_EQ(end.num_awaiting_kv, 0);
  EXPECT_EQ(end.kv_blocks_used, 0);
}

// A first token the grammar refuses, checked once the grammar is free: refused as it is when
// checked at once (the sequence waits for its KV again, under its lease), and a valid one after
// it completes the prefill.
TEST(EngineGrammarForeignTest, ARefusedFirstTokenCheckedLaterLeavesTheReservation) {
  Service s;
  auto d = MakeEngine(s.service);
  const grammar::Constraint g = Regex(Digits(22));
  const EngineRequest r = Request("r", 8, g), a = Request("a", 6, g);
  Outs out;
  Reserve(*d, r, &out);
  ASSERT_TRUE(d->AddRequest(a).ok());
  auto holder = BusyGrammar(s, *d, a, &out);
  // A token the grammar forbids at the start, and one it allows (matchers of a copy of the
  // state: only once the graph is free).
  const std::shared_ptr<const grammar::CompiledGrammar> compiled = s.Compiled(g);
  ASSERT_TRUE(d->CompleteRemotePrefill(r.id, {3}, {}).ok()) << "accepted for a later check";
  holder->Release();
  int32_t allowed = -1;
  {
    grammar::GrammarMatcher m(compiled);
    ASSERT_FALSE(m.AcceptToken(3)) << "token 3 must be outside the grammar for this test";
    for (int32_t t = 0; t < compiled->vocab().size() && allowed < 0; ++t) {
      grammar::GrammarMatcher probe(compiled);
      if (probe.AcceptToken(t)) allowed = t;
    }
  }
  ASSERT_GE(allowed, 0);
  StepUntil(*d, &out, [&] { return out[a.id].finished; });
  EXPECT_TRUE(out[r.id].tokens.empty());
  EXPECT_FALSE(out[r.id].finished) << "a refused first token leaves the request waiting";
  EXPECT_EQ(d->stats().num_awaiting_kv, 1);
  ASSERT_TRUE(d->CompleteRemotePrefill(r.id, {allowed}, {}).ok());
  StepUntil(*d, &out, [&] { return !out[r.id].tokens.empty(); });
  EXPECT_EQ(out[r.id].tokens[0], allowed);
  d->AbortRequest(r.id);
  Drain(*d, &out);
  EXPECT_EQ(d->stats().kv_blocks_used, 0);
}

TEST(EngineGrammarForeignTest, AMigratedRequestReplaysOnceItsBusyGrammarIsFree) {
  Service s;
  auto d = MakeEngine(s.service);
  const grammar::Constraint g = Regex(Digits(23));
  const EngineRequest a = Request("a", 4, g), q = Request("q", 5);
  EngineRequest m = Request("m", 9, g);
  const std::vector<int32_t> full = Solo(m).tokens;
  ASSERT_GT(full.size(), 4u);
  m.prior_output.assign(full.begin(), full.begin() + 3);
  Outs out;
  ASSERT_TRUE(d->AddRequest(a).ok());
  ASSERT_TRUE(d->AddRequest(q).ok());
  auto holder = BusyGrammar(s, *d, a, &out);

  absl::Status st;
  EXPECT_LT(Seconds([&] { st = d->AddRequest(m); }), kMaxCallSeconds)
      << "admission replayed the prior output while the grammar's mask was computed";
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_LT(StepWhileWork(*d, &out), kMaxCallSeconds);
  EXPECT_TRUE(out[q.id].finished) << "the other request kept stepping to its end";
  EXPECT_TRUE(out[m.id].tokens.empty());
  EXPECT_EQ(d->stats().grammar_mask_waiting, 2) << "the migrated request waits for the grammar";
  EXPECT_EQ(d->stats().grammar_cache_hits, 1);

  holder->Release();
  Drain(*d, &out);
  EXPECT_TRUE(out[m.id].status.ok()) << out[m.id].status;
  EXPECT_EQ(out[m.id].tokens, std::vector<int32_t>(full.begin() + 3, full.end()));
  EXPECT_EQ(out[a.id].tokens, Solo(a).tokens);
  EXPECT_EQ(d->stats().kv_blocks_used, 0);
}

// Prior output outside the grammar, found once the grammar is free: the request ends with
// INVALID_ARGUMENT (what admission answers when it can replay at once); the others are unharmed.
TEST(EngineGrammarForeignTest, APriorOutputOutsideTheGrammarFailsOnlyItsRequest) {
  Service s;
  auto d = MakeEngine(s.service);
  const grammar::Constraint g = Regex(Digits(24));
  const EngineRequest a = Request("a", 4, g);
  EngineRequest m = Request("m", 9, g);
  m.prior_output = {3};
  Outs out;
  ASSERT_TRUE(d->AddRequest(a).ok());
  auto holder = BusyGrammar(s, *d, a, &out);
  ASSERT_TRUE(d->AddRequest(m).ok());
  holder->Release();
  Drain(*d, &out);
  EXPECT_TRUE(out[m.id].finished);
  EXPECT_EQ(out[m.id].status.code(), absl::StatusCode::kInvalidArgument) << out[m.id].status;
  EXPECT_TRUE(out[a.id].status.ok()) << out[a.id].status;
  EXPECT_EQ(out[a.id].tokens, Solo(a).tokens);
  EXPECT_EQ(d->stats().kv_blocks_used, 0);
}

}  // namespace
}  // namespace tandem
