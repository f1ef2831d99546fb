// The registry of loaded adapters: names, limits, and unloading while in use.

#include "common/engine/lora/lora_registry.h"

#include <filesystem>

#include "common/engine/lora/lora_writer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

namespace fs = std::filesystem;

ModelConfig TinyConfig() {
  nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}},
                      {"model_type", "llama"},
                      {"hidden_size", 64},
                      {"intermediate_size", 96},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"vocab_size", 128},
                      {"max_position_embeddings", 256}};
  return *ParseModelConfig(j.dump(), "test");
}

class LoraRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = (fs::path(::testing::TempDir()) /
             (std::string("lora_reg_") +
              ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                .string();
    fs::remove_all(root_);
    for (int i = 0; i < 3; ++i) {
      RandomLoraOptions o;
      o.seed = i + 1;
      o.rank = i == 2 ? 32 : 8;
      ASSERT_TRUE(WriteRandomLoraAdapter(TinyConfig(), o, Dir(i)).ok());
    }
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string Dir(int i) const { return root_ + "/a" + std::to_string(i); }
  std::string root_;
};

TEST_F(LoraRegistryTest, LoadsFindsListsAndUnloads) {
  LoraOptions o;
  o.enable_lora = true;
  o.max_loras = 2;
  o.modules = {"first=" + Dir(0)};
  auto reg = MakeLoraRegistry(TinyConfig(), o);
  ASSERT_TRUE(reg.ok()) << reg.status();
  ASSERT_NE(*reg, nullptr);
  LoraRegistry& r = **reg;
  ASSERT_NE(r.Find("first"), nullptr);
  EXPECT_EQ(r.Find("second"), nullptr);
  ASSERT_TRUE(r.Load("second", Dir(1)).ok());
  EXPECT_EQ(r.Load("second", Dir(1)).code(), absl::StatusCode::kAlreadyExists);
  // max_cpu_loras unset: max_loras (2) adapters at most.
  EXPECT_EQ(r.Load("third", Dir(1)).code(), absl::StatusCode::kResourceExhausted);
  const std::vector<LoraInfo> list = r.List();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].name, "first");
  EXPECT_EQ(list[1].rank, 8);
  EXPECT_EQ(list[1].path, Dir(1));

  // Unloading an adapter a request holds: the name goes at once, the weights stay with it.
  std::shared_ptr<const LoraAdapter> held = r.Find("first");
  auto unloaded = r.Unload("first");
  ASSERT_TRUE(unloaded.ok());
  EXPECT_EQ(*unloaded, 1);
  EXPECT_EQ(r.Find("first"), nullptr);
  EXPECT_EQ(held->name, "first");
  EXPECT_TRUE(held->at(0, LoraTarget::kQ).present());
  EXPECT_EQ(r.Unload("first").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(r.Load("third", Dir(1)).ok());  // room again
}

// Loading on demand (a cluster router's request for an adapter a worker lacks): within
// --max-cpu-loras, evicting the least recently used adapter that no request holds.
TEST_F(LoraRegistryTest, AcquireEvictsTheLeastRecentlyUsedAdapterNotInUse) {
  LoraOptions o;
  o.enable_lora = true;
  o.max_loras = 1;
  o.max_cpu_loras = 2;
  auto reg = MakeLoraRegistry(TinyConfig(), o);
  ASSERT_TRUE(reg.ok()) << reg.status();
  LoraRegistry& r = **reg;
  ASSERT_TRUE(r.Acquire("a", Dir(0)).ok());
  ASSERT_TRUE(r.Acquire("b", Dir(1)).ok());
  // Loaded already from the same directory: nothing to do; from another: refused.
  std::string evicted;
  ASSERT_TRUE(r.Acquire("a", Dir(0), &evicted).ok());
  EXPECT_EQ(evicted, "");
  EXPECT_EQ(r.Acquire("a", Dir(1)).code(), absl::StatusCode::kFailedPrecondition);
  // "a" was used last (the Acquire above), so "b" goes.
  ASSERT_TRUE(r.Acquire("c", Dir(0), &evicted).ok());
  EXPECT_EQ(evicted, "b");
  EXPECT_EQ(r.Find("b"), nullptr);
  // A request's admission (Find) counts as a use: now "c" is the older one.
  ASSERT_NE(r.Find("a"), nullptr);
  ASSERT_TRUE(r.Acquire("b", Dir(1), &evicted).ok());
  EXPECT_EQ(evicted, "c");
  // An adapter a request holds is never evicted, even when least recently used.
  std::shared_ptr<const LoraAdapter> held = r.Find("a");
  ASSERT_NE(r.Find("b"), nullptr);  // "a" is now the least recently used
  ASSERT_TRUE(r.Acquire("c", Dir(0), &evicted).ok());
  EXPECT_EQ(evicted, "b");
  EXPECT_NE(r.Find("a"), nullptr);
  // Every loaded adapter held: refused, nothing unloaded.
  std::shared_ptr<const LoraAdapter> held_c = r.Find("c");
  const absl::Status full = r.Acquire("d", Dir(1));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ(r.size(), 2u);
  // A bad adapter evicts nothing.
  held_c.reset();
  EXPECT_EQ(r.Acquire("big", Dir(2)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.Find("c"), nullptr);
  // The cache key is listed (the router salts its block hashes with it).
  for (const LoraInfo& info : r.List()) EXPECT_EQ(info.cache_key, r.Find(info.name)->cache_key);
}

TEST_F(LoraRegistryTest, RefusesBadNamesAndBadAdapters) {
  LoraOptions o;
  o.enable_lora = true;
  o.max_cpu_loras = 4;
  auto reg = MakeLoraRegistry(TinyConfig(), o);
  ASSERT_TRUE(reg.ok());
  EXPECT_EQ((*reg)->Load("", Dir(0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*reg)->Load("a b", Dir(0)).code(), absl::StatusCode::kInvalidArgument);
  const absl::Status rank = (*reg)->Load("big", Dir(2));
  EXPECT_EQ(rank.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(rank.message().find("over --max-lora-rank 16"), std::string::npos) << rank;
  EXPECT_EQ((*reg)->size(), 0u);
}

TEST_F(LoraRegistryTest, OptionsAreChecked) {
  LoraOptions off;
  auto none = MakeLoraRegistry(TinyConfig(), off);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);  // LoRA off

  LoraOptions o;
  o.enable_lora = true;
  o.max_loras = 2;
  o.max_cpu_loras = 1;
  EXPECT_NE(ValidateLoraOptions(o).message().find("--max-cpu-loras (1) must be >= --max-loras"),
            std::string::npos);
  o.max_cpu_loras = 0;
  o.modules = {"noequals"};
  EXPECT_NE(ValidateLoraOptions(o).message().find("name=path"), std::string::npos);
  o.modules = {"a=" + Dir(0), "a=" + Dir(1)};
  EXPECT_NE(ValidateLoraOptions(o).message().find("given twice"), std::string::npos);
  o.modules = {"a=" + Dir(0), "b=" + Dir(1), "c=" + Dir(1)};
  EXPECT_NE(ValidateLoraOptions(o).message().find("at most 2"), std::string::npos);
  o.modules = {"a=" + Dir(2)};  // a bad module fails the start
  auto bad = MakeLoraRegistry(TinyConfig(), o);
  EXPECT_FALSE(bad.ok());
  // --lora-modules alone turns LoRA on.
  LoraOptions implied;
  implied.modules = {"a=" + Dir(0)};
  auto on = MakeLoraRegistry(TinyConfig(), implied);
  ASSERT_TRUE(on.ok()) << on.status();
  ASSERT_NE(*on, nullptr);
  EXPECT_NE((*on)->Find("a"), nullptr);
}

}  // namespace
}  // namespace tandem
