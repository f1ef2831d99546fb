#include "common/metrics/metric_reader.h"

#include "prometheus/text_serializer.h"

namespace tandem {
namespace {

bool Matches(const prometheus::ClientMetric& metric, const prometheus::Labels& labels) {
  for (const auto& [name, value] : labels) {
    bool found = false;
    for (const auto& l : metric.label) {
      if (l.name == name && l.value == value) {
        found = true;
        break;
      }
    }
    if (!found) return false;
  }
  return true;
}

}  // namespace

std::optional<double> ReadMetric(const prometheus::Collectable& registry, std::string_view name,
                                 const prometheus::Labels& labels) {
  std::optional<double> total;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      if (!Matches(m, labels)) continue;
      const double v = family.type == prometheus::MetricType::Counter ? m.counter.value
                       : family.type == prometheus::MetricType::Gauge ? m.gauge.value
                                                                      : m.untyped.value;
      total = total.value_or(0) + v;
    }
  }
  return total;
}

std::optional<HistogramReading> ReadHistogram(const prometheus::Collectable& registry,
                                              std::string_view name,
                                              const prometheus::Labels& labels) {
  std::optional<HistogramReading> out;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name || family.type != prometheus::MetricType::Histogram) continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      if (!Matches(m, labels)) continue;
      if (!out.has_value()) {
        out.emplace();
        for (const auto& b : m.histogram.bucket) out->buckets.emplace_back(b.upper_bound, 0);
      }
      out->count += m.histogram.sample_count;
      out->sum += m.histogram.sample_sum;
      for (size_t i = 0; i < m.histogram.bucket.size() && i < out->buckets.size(); ++i) {
        out->buckets[i].second += m.histogram.bucket[i].cumulative_count;
      }
    }
  }
  return out;
}

std::string SerializeMetrics(const prometheus::Collectable& registry) {
  return prometheus::TextSerializer().Serialize(registry.Collect());
}

}  // namespace tandem
