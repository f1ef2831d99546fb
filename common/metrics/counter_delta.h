#pragma once

#include <cstdint>

#include "prometheus/counter.h"

namespace tandem {

// Adds to `counter` what a monotonic source count gained since the last poll (`last`); a source
// that went backwards was restarted, and counts from zero.
inline void AddCounterDelta(prometheus::Counter* counter, int64_t now, int64_t last) {
  const int64_t delta = now >= last ? now - last : now;
  if (delta > 0) counter->Increment(static_cast<double>(delta));
}

}  // namespace tandem
