#include "common/engine/backend/cuda/device_weights.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::cuda {
namespace {

// One host piece placed at `offset` of the device buffer; a null source means zeros.
struct Piece {
  const void* src = nullptr;
  size_t bytes = 0;
  size_t offset = 0;
};

class Layout {
 public:
  // Reserves a region made of `parts` back to back; returns its offset.
  size_t Add(const std::vector<std::pair<const void*, size_t>>& parts) {
    const size_t start = size_;
    for (const auto& [src, bytes] : parts) {
      pieces_.push_back(Piece{src, bytes, size_});
      size_ += bytes;
    }
    size_ = AlignUp256(size_);
    return start;
  }
  size_t size() const { return size_; }
  const std::vector<Piece>& pieces() const { return pieces_; }

 private:
  size_t size_ = 0;
  std::vector<Piece> pieces_;
};

std::pair<const void*, size_t> Part(const Tensor& t) { return {t.data, t.nbytes()}; }

// Scratch of the tiled products over quantized weights (gemm.h): enough for the largest such
// matrix in f32, capped (larger matrices run in tiles of rows).
constexpr int64_t kDequantScratchBytes = int64_t{32} << 20;

int64_t CodeBytes(const Tensor& t) {
  return t.rows() * (t.quant == WeightQuant::kInt4 ? Int4RowBytes(t.cols()) : t.cols());
}

// One weight matrix made of `parts` stacked by rows (q/k/v, gate/up), dense or quantized.
struct MatrixPlan {
  size_t data = 0, scales = 0;  // offsets
  WeightQuant quant = WeightQuant::kNone;
  int64_t group_size = 0;
};

}  // namespace

absl::Status DeviceWeights::CheckQuantized(const Model& model) {
  const ModelWeights& w = model.weights();
  auto check = [](const std::vector<const Tensor*>& parts, const std::string& name) {
    for (const Tensor* t : parts) {
      if (t->quant != parts[0]->quant || t->group_size != parts[0]->group_size) {
        return absl::UnimplementedError(
            absl::StrCat("the CUDA backend needs the fused projections ", name,
                         " in one weight format; this model mixes ",
                         std::string(WeightQuantName(parts[0]->quant)), " and ",
                         std::string(WeightQuantName(t->quant)), " (serve it with --device cpu)"));
      }
      if (t->quant == WeightQuant::kNone) continue;
      if (t->layout != WeightLayout::kRows) {
        return absl::InvalidArgumentError(
            "the CUDA backend takes quantized weights in row layout (LoadOptions::quant_layout "
            "kRows); this model was loaded in the CPU's kTiles16 layout");
      }
      if (t->input_perm != nullptr) {
        return absl::UnimplementedError(
            "the CUDA backend does not serve act-order (desc_act) GPTQ checkpoints yet; serve "
            "it with --device cpu");
      }
    }
    return absl::OkStatus();
  };
  TANDEM_RETURN_IF_ERROR(check({&w.lm_head}, "lm_head"));
  for (const LayerWeights& lw : w.layers) {
    TANDEM_RETURN_IF_ERROR(check({&lw.q_proj, &lw.k_proj, &lw.v_proj}, "q/k/v"));
    TANDEM_RETURN_IF_ERROR(check({&lw.o_proj}, "o_proj"));
    TANDEM_RETURN_IF_ERROR(check({&lw.gate_proj, &lw.up_proj}, "gate/up"));
    TANDEM_RETURN_IF_ERROR(check({&lw.down_proj}, "down_proj"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Upload(const Model& model) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  TANDEM_RETURN_IF_ERROR(CheckQuantized(model));
  std::unique_ptr<DeviceWeights> out(new DeviceWeights());

  struct LayerOffsets {
    size_t input_norm, post_norm, qkv_bias;
    MatrixPlan qkv, o, gate_up, down;
    bool has_bias;
  };
  Layout layout;
  // Host copies that live until the upload: the int4 (scale, zero) pairs.
  std::vector<std::unique_ptr<std::vector<float>>> staged;
  int64_t dequant_bytes = 0;
  // A matrix stacked from `parts` (CheckQuantized: one format): dense elements, or the codes
  // then the scales (int8, fp8 [N]; int4 [N, G, 2], the pairs interleaved here).
  auto add_matrix = [&](const std::vector<const Tensor*>& parts) {
    MatrixPlan plan;
    plan.quant = parts[0]->quant;
    plan.group_size = parts[0]->group_size;
    std::vector<std::pair<const void*, size_t>> data, scales;
    int64_t rows = 0;
    for (const Tensor* t : parts) {
      rows += t->rows();
      if (plan.quant == WeightQuant::kNone) {
        data.push_back(Part(*t));
        continue;
      }
      data.push_back({t->data, static_cast<size_t>(CodeBytes(*t))});
      if (plan.quant == WeightQuant::kInt8 || plan.quant == WeightQuant::kFp8) {
        scales.push_back({t->scales, static_cast<size_t>(t->rows()) * sizeof(float)});
        continue;
      }
      const int64_t n = t->rows() * Int4Groups(t->cols(), t->group_size);
      auto pairs = std::make_unique<std::vector<float>>(2 * n);
      for (int64_t i = 0; i < n; ++i) {
        (*pairs)[2 * i] = t->scales[i];
        (*pairs)[2 * i + 1] = t->zeros[i];
      }
      scales.push_back({pairs->data(), pairs->size() * sizeof(float)});
      staged.push_back(std::move(pairs));
    }
    plan.data = layout.Add(data);
    if (plan.quant != WeightQuant::kNone) {
      plan.scales = layout.Add(scales);
      dequant_bytes = std::max(dequant_bytes, rows * parts[0]->cols() * int64_t{4});
    }
    return plan;
  };
  const size_t embed_off = layout.Add({Part(w.embed_tokens)});
  const bool tied = w.lm_head.data == w.embed_tokens.data;
  const MatrixPlan lm_head_plan =
      tied ? MatrixPlan{embed_off, 0, WeightQuant::kNone, 0} : add_matrix({&w.lm_head});
  const size_t final_norm_off = layout.Add({Part(w.final_norm)});
  std::vector<LayerOffsets> offsets;
  for (const LayerWeights& lw : w.layers) {
    LayerOffsets o;
    o.input_norm = layout.Add({Part(lw.input_norm)});
    o.post_norm = layout.Add({Part(lw.post_norm)});
    o.qkv = add_matrix({&lw.q_proj, &lw.k_proj, &lw.v_proj});
    o.has_bias = !lw.q_bias.empty() || !lw.k_bias.empty() || !lw.v_bias.empty();
    if (o.has_bias) {  // a missing bias among the three uploads as zeros
      o.qkv_bias = layout.Add({{lw.q_bias.data, qd * sizeof(float)},
                               {lw.k_bias.data, kvd * sizeof(float)},
                               {lw.v_bias.data, kvd * sizeof(float)}});
    }
    o.o = add_matrix({&lw.o_proj});
    o.gate_up = add_matrix({&lw.gate_proj, &lw.up_proj});
    o.down = add_matrix({&lw.down_proj});
    offsets.push_back(o);
  }
  dequant_bytes = std::min(dequant_bytes, kDequantScratchBytes);
  const size_t dequant_off =
      dequant_bytes > 0 ? layout.Add({{nullptr, static_cast<size_t>(dequant_bytes)}}) : 0;

  if (auto st = out->buffer_.Allocate(layout.size(), "model weights"); !st.ok()) return st;
  uint8_t* base = out->buffer_.as<uint8_t>();
  for (const Piece& p : layout.pieces()) {
    if (p.src == nullptr) {
      TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(base + p.offset, 0, p.bytes), "cudaMemset (weights)");
      continue;
    }
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(base + p.offset, p.src, p.bytes, cudaMemcpyHostToDevice),
        absl::StrCat("cudaMemcpy of ", p.bytes, " weight bytes to the device"));
  }

  auto matrix = [&](const MatrixPlan& plan, DType dtype, int64_t rows, int64_t cols) {
    DeviceMatrix m{base + plan.data, dtype, rows, cols};
    if (plan.quant != WeightQuant::kNone) {
      m.quant = plan.quant;
      m.scales = reinterpret_cast<const float*>(base + plan.scales);
      m.group_size = plan.group_size;
      m.dequant = base + dequant_off;
      m.dequant_bytes = dequant_bytes;
    }
    return m;
  };
  const DType wt = model.weight_dtype();
  out->embed_ = matrix(MatrixPlan{embed_off, 0, WeightQuant::kNone, 0}, w.embed_tokens.dtype,
                       c.vocab_size, d);
  out->lm_head_ = matrix(lm_head_plan, w.lm_head.dtype, c.vocab_size, d);
  out->final_norm_ = reinterpret_cast<const float*>(base + final_norm_off);
  for (size_t l = 0; l < offsets.size(); ++l) {
    const LayerOffsets& o = offsets[l];
    DeviceLayer layer;
    layer.input_norm = reinterpret_cast<const float*>(base + o.input_norm);
    layer.post_norm = reinterpret_cast<const float*>(base + o.post_norm);
    layer.qkv = matrix(o.qkv, wt, qd + 2 * kvd, d);
    layer.qkv_bias = o.has_bias ? reinterpret_cast<const float*>(base + o.qkv_bias) : nullptr;
    layer.o = matrix(o.o, wt, d, qd);
    layer.gate_up = matrix(o.gate_up, wt, 2 * f, d);
    layer.down = matrix(o.down, wt, d, f);
    out->layers_.push_back(layer);
  }
  return out;
}

}  // namespace tandem::cuda
