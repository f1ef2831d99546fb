#include "common/engine/model/rope.h"

#include <cmath>
#include <numbers>

namespace tandem {

std::vector<double> RopeInverseFrequencies(const ModelConfig& config, bool long_context) {
  const int64_t dim = config.rope_dim();
  const int64_t half = dim / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] =
        1.0 / std::pow(config.rope_theta, static_cast<double>(2 * i) / static_cast<double>(dim));
  }
  const RopeScaling& rs = config.rope_scaling;
  switch (rs.type) {
    case RopeScaling::Type::kNone:
      break;
    case RopeScaling::Type::kLinear:
      for (double& f : inv_freq) f /= rs.factor;
      break;
    case RopeScaling::Type::kLlama3: {
      const double old_context = static_cast<double>(rs.original_max_position_embeddings);
      const double low_freq_wavelen = old_context / rs.low_freq_factor;
      const double high_freq_wavelen = old_context / rs.high_freq_factor;
      for (double& f : inv_freq) {
        const double wavelen = 2.0 * std::numbers::pi / f;
        if (wavelen < high_freq_wavelen) continue;
        if (wavelen > low_freq_wavelen) {
          f /= rs.factor;
          continue;
        }
        const double smooth = (old_context / wavelen - rs.low_freq_factor) /
                              (rs.high_freq_factor - rs.low_freq_factor);
        f = (1.0 - smooth) * f / rs.factor + smooth * f;
      }
      break;
    }
    case RopeScaling::Type::kLongRope: {
      const std::vector<double>& ext = long_context ? rs.long_factor : rs.short_factor;
      for (int64_t i = 0; i < half; ++i) inv_freq[i] /= ext[i];
      break;
    }
  }
  return inv_freq;
}

std::vector<float> RopeCosSinTable(const ModelConfig& config, int64_t max_positions) {
  const std::vector<double> short_freq = RopeInverseFrequencies(config);
  const bool longrope = config.rope_scaling.type == RopeScaling::Type::kLongRope;
  const std::vector<double> long_freq =
      longrope ? RopeInverseFrequencies(config, true) : short_freq;
  const int64_t long_from =
      longrope ? config.rope_scaling.original_max_position_embeddings : max_positions;
  const double scale = longrope ? config.rope_scaling.attention_factor : 1.0;
  const size_t half = short_freq.size();
  if (max_positions <= 0) return {};
  std::vector<float> table(static_cast<size_t>(max_positions) * half * 2);
  for (int64_t pos = 0; pos < max_positions; ++pos) {
    float* row = table.data() + static_cast<size_t>(pos) * half * 2;
    const std::vector<double>& inv_freq = pos < long_from ? short_freq : long_freq;
    for (size_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos) * inv_freq[i];
      row[2 * i] = static_cast<float>(std::cos(angle) * scale);
      row[2 * i + 1] = static_cast<float>(std::sin(angle) * scale);
    }
  }
  return table;
}

}  // namespace tandem
