#include "common/engine/backend/cuda/device_weights.h"

#include <cstring>

#include "absl/strings/str_cat.h"

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

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Upload(const Model& model) {
  const ModelConfig& c = model.config();
  const ModelWeights& w = model.weights();
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  std::unique_ptr<DeviceWeights> out(new DeviceWeights());

  struct LayerOffsets {
    size_t input_norm, post_norm, qkv, qkv_bias, o, gate_up, down;
    bool has_bias;
  };
  Layout layout;
  const size_t embed_off = layout.Add({Part(w.embed_tokens)});
  const bool tied = w.lm_head.data == w.embed_tokens.data;
  const size_t lm_head_off = tied ? embed_off : layout.Add({Part(w.lm_head)});
  const size_t final_norm_off = layout.Add({Part(w.final_norm)});
  std::vector<LayerOffsets> offsets;
  for (const LayerWeights& lw : w.layers) {
    LayerOffsets o;
    o.input_norm = layout.Add({Part(lw.input_norm)});
    o.post_norm = layout.Add({Part(lw.post_norm)});
    o.qkv = layout.Add({Part(lw.q_proj), Part(lw.k_proj), Part(lw.v_proj)});
    o.has_bias = !lw.q_bias.empty() || !lw.k_bias.empty() || !lw.v_bias.empty();
    if (o.has_bias) {  // a missing bias among the three uploads as zeros
      o.qkv_bias = layout.Add({{lw.q_bias.data, qd * sizeof(float)},
                               {lw.k_bias.data, kvd * sizeof(float)},
                               {lw.v_bias.data, kvd * sizeof(float)}});
    }
    o.o = layout.Add({Part(lw.o_proj)});
    o.gate_up = layout.Add({Part(lw.gate_proj), Part(lw.up_proj)});
    o.down = layout.Add({Part(lw.down_proj)});
    offsets.push_back(o);
  }

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

  auto matrix = [&](size_t offset, DType dtype, int64_t rows, int64_t cols) {
    return DeviceMatrix{base + offset, dtype, rows, cols};
  };
  const DType wt = model.weight_dtype();
  out->embed_ = matrix(embed_off, w.embed_tokens.dtype, c.vocab_size, d);
  out->lm_head_ = matrix(lm_head_off, w.lm_head.dtype, c.vocab_size, d);
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
