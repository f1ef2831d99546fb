#include "router/placement.h"

#include "absl/types/span.h"
#include "common/cluster/block_hash.h"

namespace tandem {

std::vector<uint64_t> PromptBlockHashes(const v1::DecodeRequest& r, int64_t block_size,
                                        uint64_t lora_cache_key) {
  if (!r.lora_name().empty() && lora_cache_key == 0) return {};
  std::vector<int32_t> tokens(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
  tokens.insert(tokens.end(), r.prior_output_token_ids().begin(), r.prior_output_token_ids().end());
  if (block_size <= 0 || tokens.size() < 2) return {};
  // Like the engine: only blocks within the first len - 1 tokens can be hits.
  std::vector<uint64_t> hashes((tokens.size() - 1) / block_size);
  ComputeBlockHashes(absl::MakeSpan(tokens).subspan(0, tokens.size() - 1), block_size,
                     SaltWithAdapter(HashSalt(r.cache_salt()), lora_cache_key), hashes.data());
  return hashes;
}

std::vector<RouteCandidate> RouteCandidates(const std::vector<std::shared_ptr<Worker>>& workers,
                                            const std::vector<uint64_t>& hashes, absl::Time now) {
  std::vector<RouteCandidate> c;
  for (const auto& w : workers) {
    RouteCandidate x;
    x.worker = w;
    x.cached_blocks = w->CachedPrefix(hashes, now);
    w->TieredPrefix(hashes, &x);
    x.load_blocks = w->inflight_blocks.load();
    c.push_back(std::move(x));
  }
  return c;
}

int64_t ClusterBlockSize(const WorkerRegistry& registry) {
  auto layout = registry.layout();
  return layout.has_value() ? layout->block_size() : 16;
}

}  // namespace tandem
