#pragma once

// Shared by the tier tests: blocks with a real hash chain and a scratch directory.

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/engine/kv/tiers/tier_block.h"

namespace tandem::tier_testing {

// Block `i` of a chain of blocks of 4 tokens (tokens i*4 .. i*4+3 + seed), its payload `bytes`
// bytes derived from the seed and index.
inline std::vector<std::shared_ptr<TierBlock>> Chain(int n, int seed = 0, size_t bytes = 256,
                                                     uint64_t salt = 7) {
  std::vector<std::shared_ptr<TierBlock>> out;
  BlockHash parent = kNoParentHash;
  for (int i = 0; i < n; ++i) {
    auto b = std::make_shared<TierBlock>();
    for (int t = 0; t < 4; ++t) b->tokens.push_back(seed + i * 4 + t);
    b->parent = parent;
    b->salt = salt;
    b->hash = ComputeBlockHash(parent, b->tokens, salt);
    b->payload = TierPayload(bytes);
    for (size_t k = 0; k < bytes; ++k) b->payload[k] = static_cast<uint8_t>(k * 31 + i + seed);
    parent = b->hash;
    out.push_back(b);
  }
  return out;
}

// A fresh directory under the test's temp dir, removed at destruction.
class ScratchDir {
 public:
  ScratchDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("tier_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::remove_all(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string path() const { return path_.string(); }

 private:
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::filesystem::path path_;
};

}  // namespace tandem::tier_testing
