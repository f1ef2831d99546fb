// Adapter affinity (router/lora_routing.h): a request for a LoRA adapter goes to the workers
// holding it, else to those that can load it; the prefix-affinity policy then picks among them
// with block hashes salted by the adapter's cache key, as the workers' own.

#include "router/lora_routing.h"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/cluster/block_hash.h"
#include "router/placement.h"
#include "router/routing_policy.h"

namespace tandem {
namespace {

// A worker whose latest stats list `adapters` (name, cache key), with LoRA on when
// max_cpu_loras > 0.
std::shared_ptr<Worker> MakeWorker(const std::string& address,
                                   const std::vector<std::pair<std::string, uint64_t>>& adapters,
                                   int64_t max_cpu_loras) {
  auto w = std::make_shared<Worker>();
  w->address = address;
  w->stats.set_max_cpu_loras(max_cpu_loras);
  for (const auto& [name, key] : adapters) {
    v1::LoraAdapterState* a = w->stats.add_lora_adapters();
    a->set_name(name);
    a->set_cache_key(key);
  }
  return w;
}

std::vector<std::string> Addresses(const std::vector<std::shared_ptr<Worker>>& workers) {
  std::vector<std::string> out;
  for (const auto& w : workers) out.push_back(w->address);
  return out;
}

TEST(LoraRoutingTest, HoldersFirstThenWorkersThatCanLoad) {
  const absl::Time now = absl::Now();
  auto holder = MakeWorker("holder", {{"sql", 11}, {"poet", 22}}, 2);
  auto spare = MakeWorker("spare", {}, 2);
  auto off = MakeWorker("off", {}, 0);  // LoRA off: never serves an adapter
  const std::vector<std::shared_ptr<Worker>> all = {holder, spare, off};
  EXPECT_EQ(Addresses(LoraAffinity(all, "", now)),
            (std::vector<std::string>{"holder", "spare", "off"}));
  EXPECT_EQ(Addresses(LoraAffinity(all, "sql", now)), (std::vector<std::string>{"holder"}));
  // Nobody holds "chef": any worker with LoRA on (it loads it on demand).
  EXPECT_EQ(Addresses(LoraAffinity(all, "chef", now)),
            (std::vector<std::string>{"holder", "spare"}));
  EXPECT_TRUE(LoraAffinity({off}, "chef", now).empty());
  // Once a request for "chef" went to `spare`, the next ones follow it before its stats list it.
  spare->NoteLoraRouted("chef", now + absl::Seconds(10));
  EXPECT_TRUE(WorkerHasLora(*spare, "chef", now));
  EXPECT_EQ(Addresses(LoraAffinity(all, "chef", now)), (std::vector<std::string>{"spare"}));
  // ... until the pending time passes without a report.
  EXPECT_EQ(Addresses(LoraAffinity(all, "chef", now + absl::Seconds(11))),
            (std::vector<std::string>{"holder", "spare"}));
  EXPECT_EQ(ReportedLoraCacheKey(all, "poet"), 22u);
  EXPECT_EQ(ReportedLoraCacheKey(all, "chef"), 0u);
  EXPECT_EQ(ReportedLoraCacheKey(all, ""), 0u);
}

// A hot adapter spreads: when every holder is over the imbalance bound, the workers that can
// load it join the candidates.
TEST(LoraRoutingTest, HoldersOverTheImbalanceBoundLetOthersLoadIt) {
  const absl::Time now = absl::Now();
  auto holder = MakeWorker("holder", {{"sql", 11}}, 2);
  auto spare = MakeWorker("spare", {}, 2);
  RoutingOptions o;  // bound: 1.25 x least + 128 blocks
  holder->inflight_blocks = 200;
  spare->inflight_blocks = 80;  // 1.25 * 80 + 128 = 228 >= 200: the holder keeps it
  EXPECT_EQ(Addresses(LoraAffinity({holder, spare}, "sql", now, &o)),
            (std::vector<std::string>{"holder"}));
  spare->inflight_blocks = 40;  // 1.25 * 40 + 128 = 178 < 200
  EXPECT_EQ(Addresses(LoraAffinity({holder, spare}, "sql", now, &o)),
            (std::vector<std::string>{"holder", "spare"}));
  EXPECT_EQ(Addresses(LoraAffinity({holder, spare}, "sql", now)),
            (std::vector<std::string>{"holder"}));  // no bound given: holders only
}

TEST(LoraRoutingTest, BlockHashesAreSaltedByTheAdapterAsOnTheWorkers) {
  v1::DecodeRequest r;
  for (int i = 0; i < 40; ++i) r.add_prompt_token_ids(i + 3);
  r.set_cache_salt("tenant");
  const std::vector<uint64_t> base = PromptBlockHashes(r, 16);
  ASSERT_EQ(base.size(), 2u);
  r.set_lora_name("sql");
  // The adapter's key unknown: no worker can hold its blocks, so no hashes (never the base's).
  EXPECT_TRUE(PromptBlockHashes(r, 16, 0).empty());
  const std::vector<uint64_t> sql = PromptBlockHashes(r, 16, 11);
  ASSERT_EQ(sql.size(), 2u);
  EXPECT_NE(sql, base);
  std::vector<int32_t> tokens(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
  std::vector<uint64_t> want(2);
  ComputeBlockHashes(absl::MakeSpan(tokens).subspan(0, 32), 16,
                     SaltWithAdapter(HashSalt("tenant"), 11), want.data());
  EXPECT_EQ(sql, want);
  EXPECT_NE(PromptBlockHashes(r, 16, 22), sql);
}

// Adapter affinity outranks prefix affinity: a worker without the adapter is not a candidate
// even with the longest cached prefix; among holders, the one with the prefix wins.
TEST(LoraRoutingTest, PrefixAffinityAmongTheHolders) {
  const absl::Time now = absl::Now();
  v1::DecodeRequest r;
  for (int i = 0; i < 64; ++i) r.add_prompt_token_ids(i + 3);
  r.set_lora_name("sql");
  auto a = MakeWorker("a", {{"sql", 11}}, 2);
  auto b = MakeWorker("b", {{"sql", 11}}, 2);
  auto other = MakeWorker("other", {{"poet", 22}}, 2);
  const std::vector<std::shared_ptr<Worker>> all = {other, a, b};
  const std::vector<uint64_t> hashes = PromptBlockHashes(r, 16, ReportedLoraCacheKey(all, "sql"));
  ASSERT_EQ(hashes.size(), 3u);
  b->cached.insert(hashes.begin(), hashes.begin() + 2);
  other->cached.insert(hashes.begin(), hashes.end());
  const std::vector<std::shared_ptr<Worker>> workers = LoraAffinity(all, "sql", now);
  ASSERT_EQ(Addresses(workers), (std::vector<std::string>{"a", "b"}));
  std::vector<RouteCandidate> c = RouteCandidates(workers, hashes, now);
  std::atomic<uint64_t> counter{0};
  RoutingOptions o;
  RouteChoice choice = ChooseWorker(o, c, static_cast<int64_t>(hashes.size()), &counter);
  ASSERT_GE(choice.index, 0);
  EXPECT_EQ(c[choice.index].worker->address, "b");
}

}  // namespace
}  // namespace tandem
