#pragma once

#include <cstdint>

namespace tandem {

// What speculative decoding reports (implemented by SpecMetrics, one per proposer). Header-only
// interface: the engine calls it without linking the metrics library. Engine thread.
class SpecHooks {
 public:
  virtual ~SpecHooks() = default;
  // One sequence's proposal of `drafted` tokens, of which the first `accepted` were kept.
  virtual void OnVerification(int64_t drafted, int64_t accepted) = 0;
};

}  // namespace tandem
