// The disk tier on a real directory: blocks survive reopening (a restart), a second worker on the
// directory is refused, unfinished writes and altered files are never trusted, the capacity is
// kept by LRU, and a write the file system refuses turns the tier off with one report.
#include "common/engine/kv/tiers/disk_tier.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>

#include "absl/strings/str_format.h"
#include "common/engine/kv/tiers/kv_tier_hooks.h"
#include "tests/unit/common/engine/kv/tiers/tier_test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using tier_testing::Chain;
using tier_testing::ScratchDir;

class CountingHooks : public KvTierHooks {
 public:
  void OnLoad(double, int64_t) override {}
  void OnTierDisabled(const char* tier) override { disabled += std::string(tier) == "disk"; }
  void OnStats(const KvTierStats&) override {}
  std::atomic<int> disabled{0};
};

DiskTierOptions Options(const std::string& dir, int64_t capacity = 1 << 20) {
  DiskTierOptions o;
  o.dir = dir;
  o.capacity_bytes = capacity;
  o.fingerprint = 0xabc;
  return o;
}

std::string FileOf(const DiskTier& tier, BlockHash h) {
  return absl::StrFormat("%s/%016x.blk", tier.path(), h);
}

TEST(DiskTierTest, BlocksSurviveReopening) {
  ScratchDir dir;
  const auto chain = Chain(3);
  {
    auto tier = DiskTier::Open(Options(dir.path()));
    ASSERT_TRUE(tier.ok()) << tier.status();
    for (const auto& b : chain) (*tier)->Put(*b);
    EXPECT_EQ((*tier)->counters().blocks, 3);
  }
  auto tier = DiskTier::Open(Options(dir.path()));
  ASSERT_TRUE(tier.ok()) << tier.status();
  for (const auto& b : chain) {
    ASSERT_TRUE((*tier)->Contains(b->hash));
    auto got = (*tier)->Get(b->hash);
    ASSERT_TRUE(got.has_value());
    EXPECT_EQ(got->payload, b->payload);
    EXPECT_EQ(got->tokens, b->tokens);
  }
  EXPECT_EQ((*tier)->counters().hits, 3);
  // Another fingerprint (another model, dtype or layout) sees none of them.
  DiskTierOptions other = Options(dir.path());
  other.fingerprint = 0xdef;
  auto other_tier = DiskTier::Open(other);
  ASSERT_TRUE(other_tier.ok());
  EXPECT_FALSE((*other_tier)->Contains(chain[0]->hash));
  EXPECT_FALSE((*other_tier)->Get(chain[0]->hash).has_value());
}

TEST(DiskTierTest, SecondWorkerOnTheDirectoryIsRefused) {
  ScratchDir dir;
  auto first = DiskTier::Open(Options(dir.path()));
  ASSERT_TRUE(first.ok());
  auto second = DiskTier::Open(Options(dir.path()));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  first->reset();
  EXPECT_TRUE(DiskTier::Open(Options(dir.path())).ok());
}

TEST(DiskTierTest, DirectoryOthersCanWriteIsRefused) {
  ScratchDir dir;
  fs::create_directories(dir.path());
  ASSERT_EQ(::chmod(dir.path().c_str(), 0777), 0);
  auto tier = DiskTier::Open(Options(dir.path()));
  ASSERT_FALSE(tier.ok());
  EXPECT_NE(tier.status().message().find("writable by others"), std::string::npos);
}

TEST(DiskTierTest, UnfinishedWriteIsDeletedAndTornFileIsAMiss) {
  ScratchDir dir;
  const auto chain = Chain(2);
  std::string path, temp;
  {
    auto tier = DiskTier::Open(Options(dir.path()));
    ASSERT_TRUE(tier.ok());
    (*tier)->Put(*chain[0]);
    (*tier)->Put(*chain[1]);
    path = (*tier)->path();
    // A writer killed mid-write leaves a temporary file; a crash of the file system a torn one.
    temp = FileOf(**tier, chain[0]->hash) + ".tmp9";
    std::ofstream(temp) << "partial";
    fs::resize_file(FileOf(**tier, chain[1]->hash), 100);
  }
  auto tier = DiskTier::Open(Options(dir.path()));
  ASSERT_TRUE(tier.ok());
  EXPECT_FALSE(fs::exists(temp));
  EXPECT_TRUE((*tier)->Get(chain[0]->hash).has_value());
  EXPECT_FALSE((*tier)->Get(chain[1]->hash).has_value());
  EXPECT_EQ((*tier)->counters().corrupt, 1);
  EXPECT_FALSE((*tier)->Contains(chain[1]->hash));
  EXPECT_FALSE(fs::exists(FileOf(**tier, chain[1]->hash)));
}

TEST(DiskTierTest, FlippedByteIsAMissAndTheFileIsDeleted) {
  ScratchDir dir;
  const auto chain = Chain(1, 0, 4096);
  auto tier = DiskTier::Open(Options(dir.path()));
  ASSERT_TRUE(tier.ok());
  (*tier)->Put(*chain[0]);
  const std::string file = FileOf(**tier, chain[0]->hash);
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(3000);
    char c;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(3000);
    f.write(&c, 1);
  }
  EXPECT_FALSE((*tier)->Get(chain[0]->hash).has_value());
  const KvTierCounters c = (*tier)->counters();
  EXPECT_EQ(c.corrupt, 1);
  EXPECT_EQ(c.misses, 1);
  EXPECT_EQ(c.hits, 0);
  EXPECT_FALSE(fs::exists(file));
}

TEST(DiskTierTest, CapacityEvictsLeastRecentlyUsed) {
  ScratchDir dir;
  const auto chain = Chain(4, 0, 1000);
  const int64_t one = static_cast<int64_t>(EncodeTierBlock(*chain[0], 0xabc).size());
  auto tier = DiskTier::Open(Options(dir.path(), 3 * one));
  ASSERT_TRUE(tier.ok());
  for (int i = 0; i < 3; ++i) (*tier)->Put(*chain[i]);
  ASSERT_TRUE((*tier)->Get(chain[0]->hash).has_value());  // 0 is now the most recent
  (*tier)->Put(*chain[3]);                                // evicts 1
  EXPECT_TRUE((*tier)->Contains(chain[0]->hash));
  EXPECT_FALSE((*tier)->Contains(chain[1]->hash));
  EXPECT_FALSE(fs::exists(FileOf(**tier, chain[1]->hash)));
  EXPECT_TRUE((*tier)->Contains(chain[2]->hash));
  EXPECT_TRUE((*tier)->Contains(chain[3]->hash));
  EXPECT_EQ((*tier)->counters().used_bytes, 3 * one);
  EXPECT_EQ((*tier)->counters().evictions, 1);
  // Reopened smaller, it keeps the most recently written within the new capacity.
  tier->reset();
  auto small = DiskTier::Open(Options(dir.path(), 2 * one));
  ASSERT_TRUE(small.ok());
  EXPECT_EQ((*small)->counters().blocks, 2);
}

TEST(DiskTierTest, FullDiskTurnsTheTierOffOnce) {
  // A file-size limit makes the kernel refuse the write (EFBIG), as a full disk (ENOSPC) would.
  ScratchDir dir;
  CountingHooks hooks;
  DiskTierOptions o = Options(dir.path());
  o.hooks = &hooks;
  auto tier = DiskTier::Open(o);
  ASSERT_TRUE(tier.ok());
  const auto chain = Chain(3, 0, 8192);
  (*tier)->Put(*chain[0]);
  rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  (*tier)->Put(*chain[1]);
  (*tier)->Put(*chain[2]);
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  EXPECT_FALSE((*tier)->enabled());
  EXPECT_EQ(hooks.disabled.load(), 1);
  EXPECT_FALSE((*tier)->Contains(chain[0]->hash));
  EXPECT_FALSE((*tier)->Get(chain[0]->hash).has_value());
  // No temporary file left behind.
  for (const auto& e : fs::directory_iterator((*tier)->path())) {
    EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path();
  }
}

TEST(DiskTierTest, ReadOnlyDirectoryTurnsTheTierOff) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into read-only directories";
  ScratchDir dir;
  CountingHooks hooks;
  DiskTierOptions o = Options(dir.path());
  o.hooks = &hooks;
  auto tier = DiskTier::Open(o);
  ASSERT_TRUE(tier.ok());
  ASSERT_EQ(::chmod((*tier)->path().c_str(), 0500), 0);
  (*tier)->Put(*Chain(1)[0]);
  ::chmod((*tier)->path().c_str(), 0700);
  EXPECT_FALSE((*tier)->enabled());
  EXPECT_EQ(hooks.disabled.load(), 1);
}

// The tier's KV events (what routers are told it holds).
class RecordingListener : public KvTierListener {
 public:
  void OnTierStored(KvTier tier, BlockHash hash) override {
    std::lock_guard<std::mutex> lock(mu);
    if (tier == KvTier::kDisk) held.insert(hash);
    ++events;
  }
  void OnTierRemoved(KvTier tier, BlockHash hash) override {
    std::lock_guard<std::mutex> lock(mu);
    if (tier == KvTier::kDisk) held.erase(hash);
    ++events;
  }
  std::mutex mu;
  std::set<BlockHash> held;
  int events = 0;
};

TEST(DiskTierTest, ListenerHearsWritesRestartsEvictionsCorruptionAndTurnOff) {
  ScratchDir dir;
  const auto chain = Chain(4, 0, 1000);
  const int64_t one = static_cast<int64_t>(EncodeTierBlock(*chain[0], 0xabc).size());
  {
    RecordingListener l;
    DiskTierOptions o = Options(dir.path(), 3 * one);
    o.listener = &l;
    auto tier = DiskTier::Open(o);
    ASSERT_TRUE(tier.ok());
    for (int i = 0; i < 4; ++i) (*tier)->Put(*chain[i]);  // the fourth evicts the first
    EXPECT_EQ(l.held, (std::set<BlockHash>{chain[1]->hash, chain[2]->hash, chain[3]->hash}));
  }
  // Reopened (a restart): the blocks already there are reported as held.
  RecordingListener l;
  DiskTierOptions o = Options(dir.path(), 3 * one);
  o.listener = &l;
  auto tier = DiskTier::Open(o);
  ASSERT_TRUE(tier.ok());
  EXPECT_EQ(l.held, (std::set<BlockHash>{chain[1]->hash, chain[2]->hash, chain[3]->hash}));
  // A file that fails its checks is dropped from what the tier reports.
  {
    std::fstream f(FileOf(**tier, chain[2]->hash), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x5a');
  }
  EXPECT_FALSE((*tier)->Get(chain[2]->hash).has_value());
  EXPECT_EQ(l.held, (std::set<BlockHash>{chain[1]->hash, chain[3]->hash}));
  // Turned off: nothing is held any more.
  (*tier)->Disable("test");
  EXPECT_TRUE(l.held.empty());
}

}  // namespace
}  // namespace tandem
