// KV cache tiers in the engine (tier_feature.h) on the bundled model: a multi-turn workload whose
// working set outgrows the pool gives bit-identical greedy output with the tiers on and off, for
// every KV dtype of the CPU backend, while turns load their history from the host or disk tier; a
// new engine on the same directory (a restart) serves the old prefixes from disk and reports them
// as cached; flipped bytes are recomputed; a full disk turns the tier off while serving goes on;
// a request cancelled while its blocks load, or while they wait pinned for its admission,
// leaves no block behind.

#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/engine/engine.h"
#include "common/engine/engine_builder.h"
#include "common/engine/kv/tiers/tier_store.h"
#include "gtest/gtest.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

class ScratchDir {
 public:
  ScratchDir()
      : path_(fs::temp_directory_path() /
              ("engine_tiers_" + std::to_string(::getpid()) + "_" + std::to_string(next_++))) {
    fs::remove_all(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }

 private:
  static inline int next_ = 0;
  fs::path path_;
};

struct Tiers {
  int64_t host_bytes = 0;
  std::string dir;
  KvTierListener* listener = nullptr;
};

// The blocks the disk tier reports holding (its KV events).
class DiskBlocks : public KvTierListener {
 public:
  void OnTierStored(KvTier tier, BlockHash hash) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (tier == KvTier::kDisk) held_.insert(hash);
  }
  void OnTierRemoved(KvTier tier, BlockHash hash) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (tier == KvTier::kDisk) held_.erase(hash);
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.size();
  }

 private:
  std::mutex mu_;
  std::set<BlockHash> held_;
};

std::unique_ptr<Engine> MakeEngine(int64_t blocks, const Tiers& tiers,
                                   const std::string& kv_dtype = "auto", int64_t max_seqs = 64) {
  EngineBuildOptions b;
  b.model_dir = tandem::TestSourceDir() + "/models/stories260k";
  b.num_kv_blocks = blocks;
  b.kv_cache_dtype = kv_dtype;
  b.show_progress = false;
  b.threads = 1;
  b.engine.scheduler.max_num_seqs = max_seqs;
  b.engine.kv_tiers.host_bytes = tiers.host_bytes;
  b.engine.kv_tiers.disk_dir = tiers.dir;
  b.engine.kv_tiers.disk_bytes = 64 << 20;
  b.engine.kv_tiers.write_bytes_per_second = 0;
  b.engine.kv_tiers.listener = tiers.listener;
  auto built = BuildEngine(b);
  EXPECT_TRUE(built.ok()) << built.status();
  return built.ok() ? std::move(built->engine) : nullptr;
}

struct Result {
  std::vector<int32_t> tokens;
  int64_t cached = -1;
};

// Runs `prompts` (greedy, `max_tokens` each) to completion, all submitted at once; waits for
// loads in flight (the loop may be idle while a request waits for the tiers).
std::vector<Result> RunPrompts(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                               int32_t max_tokens, const std::string& tag) {
  std::vector<Result> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r;
    r.id = tag + std::to_string(i);
    r.prompt = prompts[i];
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    EXPECT_TRUE(engine.AddRequest(r).ok());
  }
  size_t finished = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (finished < prompts.size() && absl::Now() < deadline) {
    if (!engine.HasWork()) {
      absl::SleepFor(absl::Microseconds(200));
      continue;
    }
    for (const SequenceUpdate& u : engine.Step()) {
      Result& res = out[std::stoi(u.request_id.substr(tag.size()))];
      res.tokens.insert(res.tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.finished) {
        EXPECT_TRUE(u.status.ok()) << u.status;
        res.cached = u.cached_tokens;
        ++finished;
      }
    }
  }
  EXPECT_EQ(finished, prompts.size());
  return out;
}

// A multi-turn chat: `sessions` sessions, `turns` turns each; turn t's prompt is turn t-1's
// prompt and answer plus `user` new tokens. Turns run one wave at a time (every session's turn
// t together), so the sessions' histories compete for the pool.
struct Chat {
  std::vector<std::vector<Result>> results;  // [turn][session]
  std::vector<std::vector<std::vector<int32_t>>> prompts;
};

Chat RunChat(Engine& engine, int sessions, int turns, int user, int32_t answer, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> history(sessions, std::vector<int32_t>{1});
  Chat chat;
  for (int t = 0; t < turns; ++t) {
    for (auto& h : history) {
      for (int k = 0; k < user; ++k) h.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
    }
    chat.prompts.push_back(history);
    chat.results.push_back(RunPrompts(engine, history, answer, "t" + std::to_string(t) + "-"));
    for (int s = 0; s < sessions; ++s) {
      const auto& a = chat.results.back()[s].tokens;
      history[s].insert(history[s].end(), a.begin(), a.end());
    }
  }
  return chat;
}

void ExpectSameTokens(const Chat& a, const Chat& b) {
  ASSERT_EQ(a.results.size(), b.results.size());
  for (size_t t = 0; t < a.results.size(); ++t) {
    for (size_t s = 0; s < a.results[t].size(); ++s) {
      EXPECT_EQ(a.results[t][s].tokens, b.results[t][s].tokens) << "turn " << t << " session " << s;
    }
  }
}

int64_t CachedTokens(const Chat& c) {
  int64_t n = 0;
  for (const auto& turn : c.results) {
    for (const Result& r : turn) n += r.cached;
  }
  return n;
}

void ExpectNothingHeld(Engine& engine) {
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.kv_tiers.pinned_blocks, 0);
  EXPECT_EQ(s.num_waiting, 0);
  EXPECT_EQ(s.num_running, 0);
}

// 6 sessions x 4 turns of ~40-token growth on a 24-block pool (384 positions): the histories
// (up to ~170 tokens each, ~1000 in all) are >= 4x the pool.
constexpr int kSessions = 6, kTurns = 4, kUser = 24;
constexpr int32_t kAnswer = 16;
constexpr int64_t kPool = 24;

TEST(EngineTiersTest, GreedyIdenticalWithTiersOnAndOffForEveryKvDtype) {
  for (const std::string dtype : {"f32", "bf16", "fp8", "int8"}) {
    SCOPED_TRACE(dtype);
    auto off = MakeEngine(kPool, {}, dtype);
    const Chat base = RunChat(*off, kSessions, kTurns, kUser, kAnswer, 7);
    ScratchDir dir;
    auto disk = MakeEngine(kPool, {0, dir.path()}, dtype);
    const Chat with_disk = RunChat(*disk, kSessions, kTurns, kUser, kAnswer, 7);
    auto host = MakeEngine(kPool, {16 << 20, ""}, dtype);
    const Chat with_host = RunChat(*host, kSessions, kTurns, kUser, kAnswer, 7);
    ExpectSameTokens(base, with_disk);
    ExpectSameTokens(base, with_host);
    // The tiers served what the pool had lost.
    EXPECT_GE(disk->stats().kv_tiers.loaded_blocks, 5);
    EXPECT_GE(host->stats().kv_tiers.loaded_blocks, 5);
    EXPECT_GT(CachedTokens(with_disk), CachedTokens(base) + 160);
    EXPECT_GT(CachedTokens(with_host), CachedTokens(base) + 160);
    EXPECT_GT(disk->stats().kv_tiers.tier[1].hits, 0);
    EXPECT_GT(host->stats().kv_tiers.tier[0].hits, 0);
    // Both costs the router weighs a tier hit by were measured.
    EXPECT_GT(disk->stats().kv_tiers.tier[1].load_seconds_per_block, 0);
    EXPECT_GT(host->stats().kv_tiers.tier[0].load_seconds_per_block, 0);
    EXPECT_GT(disk->stats().kv_tiers.prefill_seconds_per_block, 0);
    ExpectNothingHeld(*disk);
    ExpectNothingHeld(*host);
  }
}

// One request at a time, sessions interleaved: every later turn finds its whole history, as with
// a pool large enough to keep everything, although the pool holds about half the sessions. The
// tail of a session's last turn may still be in the pool when its head comes back from a tier:
// it must not be evicted by the blocks the load installs.
TEST(EngineTiersTest, EachTurnFindsItsWholeHistory) {
  // 8 sessions of up to 289 + 32 tokens (20 blocks) on a 48-block pool.
  constexpr int kChatSessions = 8, kFirst = 64, kTurnUser = 32;
  constexpr int32_t kTurnAnswer = 32;
  auto run = [&](Engine& engine) {
    std::mt19937 rng(11);
    std::vector<std::vector<int32_t>> history(kChatSessions, std::vector<int32_t>{1});
    std::vector<int64_t> cached;
    for (int t = 0; t < kTurns; ++t) {
      for (int s = 0; s < kChatSessions; ++s) {
        auto& h = history[s];
        for (int k = 0; k < (t == 0 ? kFirst + kTurnUser : kTurnUser); ++k) {
          h.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
        }
        const Result r = RunPrompts(engine, {h}, kTurnAnswer, "s")[0];
        cached.push_back(r.cached);
        h.insert(h.end(), r.tokens.begin(), r.tokens.end());
      }
    }
    return cached;
  };
  auto big = MakeEngine(512, {});
  const std::vector<int64_t> all = run(*big);
  ScratchDir dir;
  auto tiered = MakeEngine(48, {0, dir.path()});
  const std::vector<int64_t> got = run(*tiered);
  auto small = MakeEngine(48, {});
  const std::vector<int64_t> pool_only = run(*small);
  ASSERT_EQ(got.size(), all.size());
  int64_t lost_by_pool = 0;
  for (size_t i = kChatSessions; i < all.size(); ++i) {
    EXPECT_EQ(got[i], all[i]) << "request " << i;
    lost_by_pool += all[i] - pool_only[i];
  }
  EXPECT_GT(lost_by_pool, 0) << "the pool alone must lose histories for this to test anything";
  ExpectNothingHeld(*tiered);
}

// Every session's next turn at once, more of them than half the pool can pin: the loads that
// would pass the pinned bound wait for the ones before them instead of letting their requests be
// admitted without their history (recomputed). A load continues the part of a history still in
// the pool, which the other sequences' allocations would evict while it runs: with a slow tier
// (each load waits 30 ms, many steps) that part must still be there when the load lands.
void ExpectConcurrentTurnsFindTheirHistory(absl::Duration load_delay) {
  constexpr int kChatSessions = 6, kFirst = 64, kTurnUser = 32;
  constexpr int32_t kTurnAnswer = 16;
  auto run = [&](Engine& engine) {
    std::mt19937 rng(5);
    std::vector<std::vector<int32_t>> history(kChatSessions, std::vector<int32_t>{1});
    int64_t cached = 0;
    for (int t = 0; t < kTurns; ++t) {
      for (auto& h : history) {
        for (int k = 0; k < (t == 0 ? kFirst + kTurnUser : kTurnUser); ++k) {
          h.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
        }
      }
      const std::vector<Result> results = RunPrompts(engine, history, kTurnAnswer, "w");
      for (int s = 0; s < kChatSessions; ++s) {
        if (t > 0) cached += results[s].cached;
        history[s].insert(history[s].end(), results[s].tokens.begin(), results[s].tokens.end());
      }
    }
    return cached;
  };
  auto big = MakeEngine(512, {});
  const int64_t all = run(*big);
  ScratchDir dir;
  auto tiered = MakeEngine(48, {0, dir.path()});
  KvTierStore::SetLoadDelayForTesting(load_delay);
  const int64_t got = run(*tiered);
  KvTierStore::SetLoadDelayForTesting(absl::ZeroDuration());
  EXPECT_GE(got, all * 9 / 10) << "of " << all;
  ExpectNothingHeld(*tiered);
}

TEST(EngineTiersTest, ConcurrentTurnsWaitForTheBoundInsteadOfRecomputing) {
  ExpectConcurrentTurnsFindTheirHistory(absl::ZeroDuration());
}

TEST(EngineTiersTest, ConcurrentTurnsKeepTheirPoolPrefixWhileASlowLoadRuns) {
  ExpectConcurrentTurnsFindTheirHistory(absl::Milliseconds(30));
}

TEST(EngineTiersTest, RestartServesOldPrefixesFromDisk) {
  ScratchDir dir;
  std::vector<std::vector<int32_t>> prompts;
  std::mt19937 rng(3);
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> p = {1};
    for (int k = 0; k < 100; ++k) p.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
    prompts.push_back(p);
  }
  std::vector<Result> first;
  {
    auto a = MakeEngine(kPool * 2, {0, dir.path()});
    first = RunPrompts(*a, prompts, 8, "a");
  }  // destroyed: the pool's cached blocks are written to disk
  DiskBlocks reported;
  auto b = MakeEngine(kPool * 2, {0, dir.path(), &reported});
  // Reopened, the disk tier reports the blocks it found (routers credit them at once).
  EXPECT_GE(reported.size(), 18u);
  const std::vector<Result> again = RunPrompts(*b, prompts, 8, "b");
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(first[i].tokens, again[i].tokens);
    EXPECT_EQ(first[i].cached, 0);
    EXPECT_EQ(again[i].cached, 96);  // 6 full blocks of the 101-token prompt
  }
  EXPECT_EQ(b->stats().kv_tiers.tier[1].hits, 18);
  ExpectNothingHeld(*b);
}

// A history on disk longer than the pinned bound (half the pool), asked for alone: loaded
// whole, not its head only with the rest recomputed.
TEST(EngineTiersTest, ALoneRequestLoadsAHistoryLongerThanThePinnedBound) {
  ScratchDir dir;
  std::mt19937 rng(7);
  std::vector<int32_t> prompt = {1};
  for (int k = 0; k < 16 * 16; ++k) {
    prompt.push_back(std::uniform_int_distribution<int>(3, 511)(rng));
  }
  std::vector<Result> first;
  {
    auto a = MakeEngine(kPool * 2, {0, dir.path()});
    first = RunPrompts(*a, {prompt}, 8, "a");
  }                                             // destroyed: its cached blocks go to disk
  auto b = MakeEngine(kPool, {0, dir.path()});  // a bound of 12 blocks
  const std::vector<Result> again = RunPrompts(*b, {prompt}, 8, "b");
  EXPECT_EQ(first[0].tokens, again[0].tokens);
  EXPECT_EQ(again[0].cached, 16 * 16);  // every full block of the 257-token prompt
  ExpectNothingHeld(*b);
}

TEST(EngineTiersTest, FlippedBytesAreRecomputed) {
  ScratchDir dir;
  std::vector<std::vector<int32_t>> prompts = {{1}};
  for (int k = 0; k < 64; ++k) prompts[0].push_back(3 + k * 7 % 500);
  std::vector<Result> first;
  std::string tier_dir;
  {
    auto a = MakeEngine(kPool, {0, dir.path()});
    first = RunPrompts(*a, prompts, 8, "a");
  }
  int flipped = 0;
  for (const auto& d : fs::directory_iterator(dir.path())) {
    for (const auto& f : fs::directory_iterator(d.path())) {
      if (f.path().extension() != ".blk") continue;
      std::fstream io(f.path(), std::ios::in | std::ios::out | std::ios::binary);
      io.seekg(200);
      char c;
      io.read(&c, 1);
      c ^= 0x04;
      io.seekp(200);
      io.write(&c, 1);
      ++flipped;
    }
  }
  ASSERT_GT(flipped, 0);
  auto b = MakeEngine(kPool, {0, dir.path()});
  const std::vector<Result> again = RunPrompts(*b, prompts, 8, "b");
  EXPECT_EQ(first[0].tokens, again[0].tokens);
  EXPECT_EQ(again[0].cached, 0);
  EXPECT_GE(b->stats().kv_tiers.tier[1].corrupt, 1);
  EXPECT_EQ(b->stats().kv_tiers.loaded_blocks, 0);
  ExpectNothingHeld(*b);
}

TEST(EngineTiersTest, FullDiskTurnsTheTierOffAndServingGoesOn) {
  ScratchDir dir;
  auto off = MakeEngine(kPool, {});
  const Chat base = RunChat(*off, kSessions, 3, kUser, kAnswer, 11);
  auto engine = MakeEngine(kPool, {0, dir.path()});
  rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 512;  // smaller than one block file
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const Chat chat = RunChat(*engine, kSessions, 3, kUser, kAnswer, 11);
  const EngineStats s = engine->stats();
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  ExpectSameTokens(base, chat);
  EXPECT_FALSE(s.kv_tiers.tier[1].enabled);
  EXPECT_EQ(s.kv_tiers.tier[1].blocks, 0);
  ExpectNothingHeld(*engine);
}

// Blocks of `prompt` on disk, then a fresh engine that has none of them in its pool.
std::unique_ptr<Engine> EngineWithPromptOnDisk(const std::string& dir,
                                               const std::vector<int32_t>& prompt,
                                               int64_t max_seqs) {
  {
    auto a = MakeEngine(kPool, {0, dir});
    RunPrompts(*a, {prompt}, 4, "w");
  }
  return MakeEngine(kPool, {0, dir}, "auto", max_seqs);
}

TEST(EngineTiersTest, CancelWhileLoadingReleasesEverything) {
  ScratchDir dir;
  std::vector<int32_t> prompt = {1};
  for (int k = 0; k < 80; ++k) prompt.push_back(5 + k);
  auto engine = EngineWithPromptOnDisk(dir.path(), prompt, 64);
  EngineRequest r;
  r.id = "x";
  r.prompt = prompt;
  r.params.max_tokens = 4;
  ASSERT_TRUE(engine->AddRequest(r).ok());
  engine->Step();  // the load starts; the request waits (pending)
  EXPECT_EQ(engine->stats().kv_tiers.loads_in_flight + engine->stats().kv_tiers.loads, 1);
  EXPECT_EQ(engine->stats().num_running, 0);
  engine->AbortRequest("x");
  for (int i = 0; i < 20; ++i) {
    engine->Step();
    absl::SleepFor(absl::Milliseconds(5));
  }
  ExpectNothingHeld(*engine);
  EXPECT_EQ(engine->stats().kv_tiers.loaded_blocks, 0);
  EXPECT_EQ(engine->stats().kv_tiers.cancelled_loads, 1);
}

TEST(EngineTiersTest, CancelWhilePinnedReleasesEverything) {
  ScratchDir dir;
  std::vector<int32_t> prompt = {1};
  for (int k = 0; k < 80; ++k) prompt.push_back(5 + k);
  // One sequence slot: a long request runs, so the loaded one waits, its blocks pinned.
  auto engine = EngineWithPromptOnDisk(dir.path(), prompt, 1);
  EngineRequest busy;
  busy.id = "busy";
  busy.prompt = {1, 9, 9, 9};
  busy.params.max_tokens = 200;
  busy.params.ignore_eos = true;
  ASSERT_TRUE(engine->AddRequest(busy).ok());
  engine->Step();
  EngineRequest r;
  r.id = "x";
  r.prompt = prompt;
  r.params.max_tokens = 4;
  ASSERT_TRUE(engine->AddRequest(r).ok());
  for (int i = 0; i < 200 && engine->stats().kv_tiers.pinned_blocks == 0; ++i) {
    engine->Step();
    absl::SleepFor(absl::Milliseconds(2));
  }
  ASSERT_EQ(engine->stats().kv_tiers.pinned_blocks, 5);  // 80 tokens: 5 full blocks
  engine->AbortRequest("x");
  engine->AbortRequest("busy");
  engine->Step();
  ExpectNothingHeld(*engine);
}

}  // namespace
}  // namespace tandem
