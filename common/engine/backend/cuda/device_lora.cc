#include "common/engine/backend/cuda/device_lora.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace tandem::cuda {
namespace {

// Grows `buffer` to at least `bytes` (twice as much, to grow rarely), after waiting for `stream`:
// a launched step may still read the old allocation.
absl::Status Reserve(DeviceBuffer* buffer, size_t bytes, cudaStream_t stream, const char* what) {
  if (buffer->bytes() >= bytes) return absl::OkStatus();
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "cudaStreamSynchronize (LoRA)");
  return buffer->Allocate(AlignUp256(2 * bytes), what);
}

}  // namespace

size_t DeviceLora::resident_bytes() const {
  size_t total = 0;
  for (const auto& [adapter, r] : resident_) total += r.buffer.bytes();
  return total;
}

absl::Status DeviceLora::CheckShapes(const LoraAdapter& adapter) const {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  const int64_t in[kNumLoraTargets] = {d, d, d, qd, d, d, f};
  const int64_t out[kNumLoraTargets] = {qd, kvd, kvd, d, f, f, d};
  if (static_cast<int64_t>(adapter.layers.size()) != c.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA adapter '", adapter.name, "' has ",
                                                   adapter.layers.size(), " layers, the model ",
                                                   c.num_layers));
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (int t = 0; t < kNumLoraTargets; ++t) {
      const LoraMatrices& m = adapter.layers[l][t];
      if (!m.present()) continue;
      if (m.b == nullptr || m.in != in[t] || m.out != out[t] ||
          (m.dtype != DType::kF32 && m.dtype != DType::kBF16)) {
        return absl::InvalidArgumentError(
            absl::StrCat("LoRA adapter '", adapter.name, "': layer ", l, " ",
                         LoraTargetName(static_cast<LoraTarget>(t)), " is [", m.out, ", ", m.in,
                         "] ", std::string(DTypeName(m.dtype)), ", the model's projection is [",
                         out[t], ", ", in[t], "] (f32 or bf16 adapters)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status DeviceLora::Upload(const LoraAdapter& adapter, Resident* r) {
  TANDEM_RETURN_IF_ERROR(CheckShapes(adapter));
  const int64_t entries = static_cast<int64_t>(adapter.layers.size()) * kNumLoraTargets;
  // Layout: the entry table, then each present A and B (256-byte aligned), as one allocation
  // filled by one synchronous copy.
  struct Piece {
    const void* src;
    size_t bytes, offset;
  };
  std::vector<Piece> pieces;
  size_t size = AlignUp256(entries * sizeof(LoraDeviceEntry));
  std::vector<size_t> a_at(entries, 0), b_at(entries, 0);
  for (int64_t e = 0; e < entries; ++e) {
    const LoraMatrices& m = adapter.layers[e / kNumLoraTargets][e % kNumLoraTargets];
    if (!m.present()) continue;
    const size_t elem = DTypeSize(m.dtype);
    a_at[e] = size;
    pieces.push_back({m.a, adapter.rank * m.in * elem, size});
    size += AlignUp256(pieces.back().bytes);
    b_at[e] = size;
    pieces.push_back({m.b, m.out * adapter.rank * elem, size});
    size += AlignUp256(pieces.back().bytes);
  }
  TANDEM_RETURN_IF_ERROR(
      r->buffer.Allocate(size, absl::StrCat("LoRA adapter '", adapter.name, "'")));
  uint8_t* base = r->buffer.as<uint8_t>();
  std::vector<uint8_t> host(size, 0);
  auto* table = reinterpret_cast<LoraDeviceEntry*>(host.data());
  for (int64_t e = 0; e < entries; ++e) {
    const LoraMatrices& m = adapter.layers[e / kNumLoraTargets][e % kNumLoraTargets];
    table[e] = LoraDeviceEntry{};
    if (!m.present()) continue;
    table[e].a = base + a_at[e];
    table[e].b = base + b_at[e];
    table[e].bf16 = m.dtype == DType::kBF16 ? 1 : 0;
    table[e].rank = static_cast<int32_t>(adapter.rank);
  }
  for (const Piece& p : pieces) std::memcpy(host.data() + p.offset, p.src, p.bytes);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemcpy(base, host.data(), size, cudaMemcpyHostToDevice),
                              "cudaMemcpy (LoRA adapter upload)");
  r->table = reinterpret_cast<const LoraDeviceEntry*>(base);
  ++uploads_;
  return absl::OkStatus();
}

absl::Status DeviceLora::Sweep(cudaStream_t stream) {
  bool synced = false;
  for (auto it = resident_.begin(); it != resident_.end();) {
    if (!it->second.owner.expired()) {
      ++it;
      continue;
    }
    if (!synced) {  // a launched step may still read it
      TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "cudaStreamSynchronize (LoRA)");
      synced = true;
    }
    it = resident_.erase(it);
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> DeviceLora::Prepare(const ForwardBatch& b, int slot, int64_t padded_tokens,
                                         cudaStream_t stream) {
  tokens_ = 0;
  max_rank_ = 0;
  TANDEM_RETURN_IF_ERROR(Sweep(stream));
  std::vector<const LoraAdapter*> groups;
  std::vector<int32_t> group_of_seq(b.seqs.size(), -1);
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    const LoraAdapter* a = b.seqs[s].lora;
    if (a == nullptr) continue;
    auto found = std::find(groups.begin(), groups.end(), a);
    group_of_seq[s] = static_cast<int32_t>(found - groups.begin());
    if (found == groups.end()) groups.push_back(a);
  }
  if (groups.empty()) return false;

  for (const LoraAdapter* a : groups) {
    auto it = resident_.find(a);
    if (it != resident_.end()) continue;
    Resident r;
    r.owner = a->weak_from_this();
    TANDEM_RETURN_IF_ERROR(Upload(*a, &r));
    resident_.emplace(a, std::move(r));
  }
  for (const LoraAdapter* a : groups) {
    max_rank_ = std::max<int32_t>(max_rank_, static_cast<int32_t>(a->rank));
  }

  // Staging: group_of_token [padded_tokens] int32, then the groups.
  groups_offset_ = AlignUp256(padded_tokens * sizeof(int32_t));
  const size_t bytes = groups_offset_ + groups.size() * sizeof(LoraDeviceGroup);
  std::vector<uint8_t>& host = staging_[slot & 1];
  host.assign(bytes, 0);
  auto* group_of_token = reinterpret_cast<int32_t*>(host.data());
  for (int64_t t = 0; t < padded_tokens; ++t) {
    group_of_token[t] = t < b.num_tokens() ? group_of_seq[b.seq_of_token[t]] : -1;
  }
  auto* device_groups = reinterpret_cast<LoraDeviceGroup*>(host.data() + groups_offset_);
  for (size_t g = 0; g < groups.size(); ++g) {
    const LoraAdapter* a = groups[g];
    device_groups[g] =
        LoraDeviceGroup{resident_.at(a).table, a->scale, static_cast<int32_t>(a->rank)};
  }
  TANDEM_RETURN_IF_ERROR(Reserve(&step_, bytes, stream, "LoRA step inputs"));
  TANDEM_RETURN_IF_ERROR(
      Reserve(&low_, padded_tokens * max_rank_ * sizeof(float), stream, "LoRA low-rank scratch"));
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(step_.get(), host.data(), bytes, cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync (LoRA step inputs)");
  tokens_ = padded_tokens;
  return true;
}

absl::Status DeviceLora::Add(int64_t layer, LoraTarget target, const GemmInput& x, int64_t k,
                             float* y, int64_t ldy, int64_t n, cudaStream_t stream) {
  if (tokens_ == 0) return absl::OkStatus();
  LoraProductArgs a;
  a.group_of_token = step_.as<int32_t>();
  a.groups = reinterpret_cast<const LoraDeviceGroup*>(step_.as<uint8_t>() + groups_offset_);
  a.entry = static_cast<int32_t>(layer * kNumLoraTargets + static_cast<int>(target));
  a.max_rank = max_rank_;
  a.tokens = tokens_;
  a.u = low_.as<float>();
  a.x = x.data;
  a.x_bf16 = x.bf16;
  a.ldx = x.ld;
  a.k = k;
  a.y = y;
  a.ldy = ldy;
  a.n = n;
  TANDEM_CUDA_RETURN_IF_ERROR(LoraShrink(a, stream), "LoraShrink kernel launch");
  TANDEM_CUDA_RETURN_IF_ERROR(LoraExpand(a, stream), "LoraExpand kernel launch");
  return absl::OkStatus();
}

}  // namespace tandem::cuda
