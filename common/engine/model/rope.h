#pragma once

#include <cstdint>
#include <vector>

#include "common/config/model_config.h"

namespace tandem {

// Rotary embedding frequencies, computed the way Hugging Face transformers'
// _compute_default_rope_parameters, _compute_linear_scaling_rope_parameters and
// _compute_llama3_parameters do, but evaluated in double (transformers uses float32):
//   default: inv_freq[i] = 1 / rope_theta^(2i / head_dim), i < head_dim / 2
//   linear:  inv_freq[i] / factor
//   llama3:  wavelen = 2*pi / inv_freq[i];
//            wavelen < original_max / high_freq_factor: unchanged (high frequencies)
//            wavelen > original_max / low_freq_factor:  inv_freq[i] / factor (low frequencies)
//            otherwise: (1 - s) * inv_freq[i] / factor + s * inv_freq[i],
//                       s = (original_max / wavelen - low_freq_factor) /
//                           (high_freq_factor - low_freq_factor)
//   longrope: 1 / (ext[i] * rope_theta^(2i / head_dim)), ext = short_factor for positions below
//            original_max_position_embeddings, long_factor from there on (`long_context`)
// Returns head_dim / 2 values (with partial rotary, `head_dim` above is rotary_dim throughout).
std::vector<double> RopeInverseFrequencies(const ModelConfig& config, bool long_context = false);

// cos/sin table for positions [0, max_positions): laid out [pos][i][2] = (cos, sin) of
// pos * inv_freq[i], the angle computed in double and the results cast to float. This is the
// `cos_sin` argument of cpu::ApplyRope. Size: max_positions * rope_dim() floats. LongRoPE picks
// the frequencies by position (short below original_max_position_embeddings, long from there on:
// a token's rotation depends on its position only, never on its batch or on how long its
// sequence has become; transformers instead switches a whole forward to the long factors once
// the sequence passes that length) and scales cos and sin by attention_factor.
std::vector<float> RopeCosSinTable(const ModelConfig& config, int64_t max_positions);

}  // namespace tandem
