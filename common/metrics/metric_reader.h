#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/labels.h"

namespace tandem {

// Reads metric values back out of a registry (tests, debugging). A series matches when it has
// every label in `labels` (it may have more); values of all matching series are summed.

// The summed value of a counter or gauge family, or nullopt when no series matches.
std::optional<double> ReadMetric(const prometheus::Collectable& registry, std::string_view name,
                                 const prometheus::Labels& labels = {});

struct HistogramReading {
  uint64_t count = 0;
  double sum = 0;
  std::vector<std::pair<double, uint64_t>> buckets;  // (upper bound, cumulative count)
};
std::optional<HistogramReading> ReadHistogram(const prometheus::Collectable& registry,
                                              std::string_view name,
                                              const prometheus::Labels& labels = {});

// The registry in Prometheus text exposition format, as /metrics serves it.
std::string SerializeMetrics(const prometheus::Collectable& registry);

}  // namespace tandem
