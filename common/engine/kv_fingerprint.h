#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/engine/backend/backend.h"

namespace tandem {

// The KV tiers' fingerprint (kv/tiers/README.md "Fingerprint"): a 64-bit hash of everything that
// changes a KV block's bytes besides its tokens and salt: the model directory's config.json,
// every *.safetensors file's size, header and 16 samples of 4 KiB spread over it (a fine-tune of
// the same architecture differs there), `settings` (weight dtype, quantization, MatMul input
// dtype, backend and its kernels' tier: name/value pairs BuildEngine gives), the KV layout (`spec`:
// layers, heads, head size, block size, dtype) and the tier file format.
absl::StatusOr<uint64_t> KvTierFingerprint(
    const std::string& model_dir, const KvCacheSpec& spec,
    const std::vector<std::pair<std::string, std::string>>& settings);

}  // namespace tandem
