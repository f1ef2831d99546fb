// KV cache tiers (common/engine/tier_feature.h) on the emulated CUDA backend, whose pool is device
// memory: blocks leave the pool and come back through asynchronous copies (Backend::StartBlockRead
// / StartBlockWrite) rather than synchronous region reads and writes. Deferred streams (the
// emulator runs a stream's work only when the host waits for it) and the overlapped engine loop:
// a copy-out the host read before it landed, or an install that was not ordered before the
// forward pass reading it, would change tokens; a copy that waited for the stream shows as a
// stream synchronization. The host tier is page-locked memory (counted by the emulator's
// cudaMallocHost): blocks go between it and the pool by DMA, with no staging copy.

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/cuda/emulation/fake_cuda.h"
#include "common/engine/backend/cuda/cuda_backend_impl.h"
#include "common/engine/engine.h"
#include "common/engine/kv/tiers/host_arena.h"
#include "common/engine/kv/tiers/tier_store.h"
#include "gtest/gtest.h"
#include "tests/unit/common/engine/backend/cpu/backend_test_util.h"
#include "tests/unit/common/engine/kv/tiers/tier_test_util.h"

namespace tandem {
namespace {

struct Chat {
  std::vector<std::vector<std::vector<int32_t>>> tokens;  // [turn][session]
  EngineStats stats;
  int64_t stream_syncs = 0;  // while the engine stepped
  // The backend's whole-block copies (block_staging.h) and the emulator's pinned-memory counters.
  int64_t direct_copies = 0, staged_copies = 0, staged_host_bytes = 0;
  int64_t pageable_async_copies = 0;  // while the engine stepped
  int64_t pinned_bytes = 0;           // page-locked host memory while the engine lived
};

// The emulated CUDA backend every test here runs on: deferred streams (copies land only when the
// stream runs), a 24-block f32 pool.
auto TierBackend(const std::shared_ptr<const Model>& model) {
  cuda_emu::SetDeferredStreams(true);
  CudaBackendOptions options;
  options.num_blocks = 24;
  options.kv_dtype = DType::kF32;
  options.max_num_tokens = 512;
  options.max_num_seqs = 16;
  options.max_graph_tokens = 16;
  return cuda::CudaBackend::Create(model, options);
}

// `sessions` multi-turn chats whose histories (about 4x the pool) compete for a 24-block pool;
// turn t of every session runs together; each turn adds 24 user tokens to the last answer.
Chat RunChat(bool tiers, int sessions = 6, int turns = 5) {
  Chat chat;
  std::shared_ptr<const Model> model = testing::Load("stories260k", DType::kF32);
  auto backend = TierBackend(model);
  EXPECT_TRUE(backend.ok()) << backend.status();
  if (!backend.ok()) return chat;
  cuda::CudaBackend* cuda = backend->get();
  const int64_t pinned_before = cuda_emu::PinnedBytes();
  EngineOptions engine_options;
  engine_options.async_scheduling = true;
  engine_options.scheduler.max_num_batched_tokens = 256;
  engine_options.scheduler.max_num_seqs = 16;
  if (tiers) {
    engine_options.kv_tiers.host_bytes = 32 << 20;
    engine_options.kv_tiers.fingerprint = 1;
  }
  auto engine = Engine::Create(engine_options, model, *std::move(backend));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return chat;
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> history(sessions, std::vector<int32_t>{1});
  const int64_t syncs_before = cuda_emu::StreamSyncs();
  const int64_t pageable_before = cuda_emu::PageableAsyncCopies();
  for (int t = 0; t < turns; ++t) {
    for (int s = 0; s < sessions; ++s) {
      for (int k = 0; k < 24; ++k) {
        history[s].push_back(std::uniform_int_distribution<int>(3, 511)(rng));
      }
      EngineRequest r;
      r.id = std::to_string(s);
      r.prompt = history[s];
      r.params.max_tokens = 12;
      r.params.ignore_eos = true;
      EXPECT_TRUE((*engine)->AddRequest(r).ok());
    }
    std::vector<std::vector<int32_t>> answers(sessions);
    int finished = 0, guard = 0;
    while (finished < sessions && ++guard < 100000) {
      if (!(*engine)->HasWork()) {
        absl::SleepFor(absl::Microseconds(200));  // a load from the tiers in flight
        continue;
      }
      for (const SequenceUpdate& u : (*engine)->Step()) {
        auto& a = answers[std::stoi(u.request_id)];
        a.insert(a.end(), u.new_tokens.begin(), u.new_tokens.end());
        if (u.finished) {
          EXPECT_TRUE(u.status.ok()) << u.status;
          ++finished;
        }
      }
    }
    EXPECT_EQ(finished, sessions);
    for (int s = 0; s < sessions; ++s) {
      history[s].insert(history[s].end(), answers[s].begin(), answers[s].end());
    }
    chat.tokens.push_back(std::move(answers));
  }
  chat.stream_syncs = cuda_emu::StreamSyncs() - syncs_before;
  chat.pageable_async_copies = cuda_emu::PageableAsyncCopies() - pageable_before;
  chat.stats = (*engine)->stats();
  chat.direct_copies = cuda->block_copies().direct_copies();
  chat.staged_copies = cuda->block_copies().staged_copies();
  chat.staged_host_bytes = cuda->block_copies().staged_host_bytes();
  chat.pinned_bytes = cuda_emu::PinnedBytes() - pinned_before;
  return chat;
}

// Greedy output is the same with the tiers on and off; turns found their history in the host
// tier (blocks copied out at eviction and installed back), and no copy waited for the device.
TEST(CudaEngineTiersTest, AsynchronousCopiesGiveTheSameTokensWithoutWaiting) {
  const Chat off = RunChat(false);
  const Chat on = RunChat(true);
  ASSERT_EQ(on.tokens.size(), off.tokens.size());
  for (size_t t = 0; t < off.tokens.size(); ++t) {
    EXPECT_EQ(on.tokens[t], off.tokens[t]) << "turn " << t;
  }
  const KvTierStats& tiers = on.stats.kv_tiers;
  EXPECT_GT(tiers.tier[0].bytes_in, 0);  // copied out at eviction
  EXPECT_GT(tiers.loaded_blocks, 10);    // and installed back
  EXPECT_EQ(tiers.write_drops, 0);
  EXPECT_EQ(on.stream_syncs, 0);
  EXPECT_EQ(off.stream_syncs, 0);
  EXPECT_GT(on.stats.overlapped_steps, 5);
  // The host tier is page-locked memory, allocated at start and reported.
  EXPECT_GE(on.pinned_bytes, 32 << 20);
  EXPECT_EQ(tiers.tier[0].pinned_bytes, 32 << 20);
  // Every copy-out and install was a DMA straight between the pool and a host tier slot: no
  // staging slot, no host copy of block bytes, no copy from pageable memory.
  EXPECT_GT(on.direct_copies, tiers.loaded_blocks);  // every install, and copy-outs
  EXPECT_EQ(on.staged_copies, 0);
  EXPECT_EQ(on.staged_host_bytes, 0);
  EXPECT_EQ(on.pageable_async_copies, 0);
  EXPECT_EQ(off.pageable_async_copies, 0);
}

std::vector<TierLoad> WaitForLoad(KvTierStore& store) {
  std::vector<TierLoad> out;
  for (int i = 0; i < 5000 && out.empty(); ++i) {
    out = store.TakeCompleted();
    if (out.empty()) absl::SleepFor(absl::Milliseconds(1));
  }
  return out;
}

// What the device holds in pool block `block` (waits for the stream).
std::vector<uint8_t> DeviceBlock(Backend& backend, int32_t block) {
  const KvCacheSpec& spec = backend.kv_spec();
  std::vector<uint8_t> out(spec.bytes_per_block());
  for (int64_t l = 0; l < spec.num_layers; ++l) {
    EXPECT_TRUE(
        backend.ReadBlockRegion(l, block, out.data() + l * spec.bytes_per_block_layer()).ok());
  }
  return out;
}

std::vector<uint8_t> Bytes(const TierPayload& p) { return {p.data(), p.data() + p.size()}; }

// An install reads its block's host tier slot by DMA until the copy has landed (the stream here
// is deferred: it runs when the host waits). Held until then, as TierFeature holds it until
// PollBlockCopy says landed, the slot is neither evicted nor refilled, and the device gets the
// block's bytes. The control: let go of at once, the slot is evicted and refilled by the next
// disk read before the copy ran, and the device gets that other block's bytes.
TEST(CudaEngineTiersTest, AnInstallsSlotIsNotReusedBeforeItsCopyLanded) {
  for (const bool hold : {true, false}) {
    SCOPED_TRACE(hold ? "held until landed" : "let go at once");
    cuda_emu::SetDeferredStreams(true);
    std::shared_ptr<const Model> model = testing::Load("stories260k", DType::kF32);
    CudaBackendOptions options;
    options.num_blocks = 4;
    options.kv_dtype = DType::kF32;
    auto backend = cuda::CudaBackend::Create(model, options);
    ASSERT_TRUE(backend.ok()) << backend.status();
    const size_t bytes = (*backend)->kv_spec().bytes_per_block();
    // A host tier of one slot of page-locked memory, and a disk tier.
    absl::StatusOr<HostMemory> memory = (*backend)->AllocateHostMemory(bytes);
    ASSERT_TRUE(memory.ok()) << memory.status();
    EXPECT_TRUE(memory->pinned);
    EXPECT_TRUE(cuda_emu::IsPinned(memory->data.get(), bytes));
    auto arena = HostArena::Create(memory->data, memory->bytes, bytes, memory->pinned);
    ASSERT_EQ(arena->slots(), 1);
    tier_testing::ScratchDir dir;
    KvTierOptions o;
    o.host_bytes = static_cast<int64_t>(2 * bytes);
    o.disk_dir = dir.path();
    o.fingerprint = 5;
    auto store = KvTierStore::Create(o, arena);
    ASSERT_TRUE(store.ok()) << store.status();
    // Block A in the host tier's slot (and on disk), block B (heap memory) on disk only.
    const auto chain = tier_testing::Chain(2, 0, bytes);
    auto a = std::make_shared<TierBlock>();
    a->hash = chain[0]->hash;
    a->parent = chain[0]->parent;
    a->salt = chain[0]->salt;
    a->tokens = chain[0]->tokens;
    a->payload = (*store)->AllocatePayload(bytes);
    ASSERT_TRUE(a->payload.in_arena());
    std::memcpy(a->payload.data(), chain[0]->payload.data(), bytes);
    (*store)->Offer(std::move(a));
    (*store)->Offer(chain[1]);
    ASSERT_TRUE((*store)->Flush(absl::Seconds(10)));
    ASSERT_EQ((*store)->stats().tier[0].blocks, 1);
    // A loaded from the host tier and installed into pool block 0 by DMA.
    (*store)->StartLoad({chain[0]->hash});
    std::vector<TierLoad> loads = WaitForLoad(**store);
    ASSERT_EQ(loads.size(), 1u);
    ASSERT_EQ(loads[0].blocks.size(), 1u);
    TierBlockPtr installing = loads[0].blocks[0];
    loads.clear();
    ASSERT_TRUE(installing->payload.in_arena());
    const std::optional<uint64_t> ticket =
        (*backend)->StartBlockWrite(0, installing->payload.data());
    ASSERT_TRUE(ticket.has_value());
    if (!hold) installing.reset();
    // B read from disk: into the host tier's slot if it can be had.
    (*store)->StartLoad({chain[1]->hash});
    loads = WaitForLoad(**store);
    ASSERT_EQ(loads.size(), 1u);
    ASSERT_EQ(loads[0].blocks.size(), 1u);
    EXPECT_EQ(loads[0].blocks[0]->payload.in_arena(), !hold);
    const absl::StatusOr<bool> landed = (*backend)->PollBlockCopy(*ticket, /*wait=*/true);
    ASSERT_TRUE(landed.ok()) << landed.status();
    EXPECT_TRUE(*landed);
    EXPECT_EQ(DeviceBlock(**backend, 0), Bytes((hold ? chain[0] : chain[1])->payload));
    EXPECT_EQ((*backend)->block_copies().direct_copies(), 1);
    EXPECT_EQ((*backend)->block_copies().staged_host_bytes(), 0);
  }
}

struct TierEngine {
  std::unique_ptr<Engine> engine;
  cuda::CudaBackend* cuda = nullptr;
};

// An engine on the emulated CUDA backend (deferred streams, overlapped loop) with a 32 MiB host
// tier and a 24-block pool.
TierEngine MakeTierEngine(int max_seqs) {
  std::shared_ptr<const Model> model = testing::Load("stories260k", DType::kF32);
  auto backend = TierBackend(model);
  EXPECT_TRUE(backend.ok()) << backend.status();
  if (!backend.ok()) return {};
  TierEngine out;
  out.cuda = backend->get();
  EngineOptions engine_options;
  engine_options.async_scheduling = true;
  engine_options.scheduler.max_num_batched_tokens = 256;
  engine_options.scheduler.max_num_seqs = max_seqs;
  engine_options.kv_tiers.host_bytes = 32 << 20;
  engine_options.kv_tiers.fingerprint = 1;
  auto engine = Engine::Create(engine_options, model, *std::move(backend));
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (engine.ok()) out.engine = *std::move(engine);
  return out;
}

std::vector<int32_t> Prompt(int32_t seed) {
  std::vector<int32_t> p = {1};
  for (int k = 0; k < 80; ++k) p.push_back(3 + (seed * 37 + k * 11) % 500);
  return p;
}

void RunToEnd(Engine& engine, const std::string& id, const std::vector<int32_t>& prompt) {
  EngineRequest r;
  r.id = id;
  r.prompt = prompt;
  r.params.max_tokens = 2;
  ASSERT_TRUE(engine.AddRequest(r).ok());
  for (int i = 0; i < 10000 && engine.HasWork(); ++i) engine.Step();
}

// `prompt`'s blocks in the host tier only: run, then pushed out of the 24-block pool by others.
void PromptInHostTier(Engine& engine, const std::vector<int32_t>& prompt) {
  RunToEnd(engine, "first", prompt);
  for (int i = 1; i <= 6; ++i) RunToEnd(engine, "other" + std::to_string(i), Prompt(i));
  for (int i = 0; i < 5; ++i) engine.Step();  // the last copy-outs offered
  ASSERT_GE(engine.stats().kv_tiers.tier[0].blocks, 5);
}

void ExpectNothingHeld(const TierEngine& t) {
  for (int i = 0; i < 20; ++i) {
    t.engine->Step();
    absl::SleepFor(absl::Milliseconds(5));
  }
  const EngineStats s = t.engine->stats();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.kv_tiers.pinned_blocks, 0);
  EXPECT_EQ(s.kv_tiers.loads_in_flight, 0);
  EXPECT_EQ(s.num_waiting, 0);
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(t.cuda->block_copies().copies_in_flight(), 0);
}

// A request cancelled while its blocks load from the pinned host tier, and one cancelled while its
// installed blocks wait pinned for its admission (their DMA possibly in flight): every pool block
// and copy comes back, and once the engine is gone so does all its page-locked memory (no block
// kept a host tier slot).
TEST(CudaEngineTiersTest, CancelDuringALoadReleasesEverything) {
  const int64_t pinned_before = cuda_emu::PinnedBytes();
  {
    TierEngine t = MakeTierEngine(16);
    ASSERT_NE(t.engine, nullptr);
    const std::vector<int32_t> prompt = Prompt(0);
    PromptInHostTier(*t.engine, prompt);
    KvTierStore::SetLoadDelayForTesting(absl::Milliseconds(50));
    EngineRequest r;
    r.id = "x";
    r.prompt = prompt;
    r.params.max_tokens = 4;
    ASSERT_TRUE(t.engine->AddRequest(r).ok());
    t.engine->Step();  // the load starts; the request waits
    EXPECT_EQ(t.engine->stats().kv_tiers.loads_in_flight, 1);
    t.engine->AbortRequest("x");
    ExpectNothingHeld(t);
    KvTierStore::SetLoadDelayForTesting(absl::ZeroDuration());
    EXPECT_EQ(t.engine->stats().kv_tiers.cancelled_loads, 1);
    EXPECT_EQ(t.engine->stats().kv_tiers.loaded_blocks, 0);
  }
  {
    TierEngine t = MakeTierEngine(1);
    ASSERT_NE(t.engine, nullptr);
    const std::vector<int32_t> prompt = Prompt(0);
    PromptInHostTier(*t.engine, prompt);
    // One sequence slot: a long request runs, so the loaded one waits, its blocks pinned.
    EngineRequest busy;
    busy.id = "busy";
    busy.prompt = {1, 9, 9, 9};
    busy.params.max_tokens = 200;
    busy.params.ignore_eos = true;
    ASSERT_TRUE(t.engine->AddRequest(busy).ok());
    t.engine->Step();
    EngineRequest r;
    r.id = "x";
    r.prompt = prompt;
    r.params.max_tokens = 4;
    ASSERT_TRUE(t.engine->AddRequest(r).ok());
    for (int i = 0; i < 200 && t.engine->stats().kv_tiers.pinned_blocks == 0; ++i) {
      t.engine->Step();
      absl::SleepFor(absl::Milliseconds(2));
    }
    ASSERT_EQ(t.engine->stats().kv_tiers.pinned_blocks, 5);  // 80 tokens: 5 full blocks
    t.engine->AbortRequest("x");
    t.engine->AbortRequest("busy");
    ExpectNothingHeld(t);
  }
  EXPECT_EQ(cuda_emu::PinnedBytes(), pinned_before);
}

}  // namespace
}  // namespace tandem
