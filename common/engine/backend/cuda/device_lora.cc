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

// The [in, out] of a target's projection.
void ProjectionShape(const ModelConfig& c, int t, int64_t* in, int64_t* out) {
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  const int64_t ins[kNumLoraTargets] = {d, d, d, qd, d, d, f};
  const int64_t outs[kNumLoraTargets] = {qd, kvd, kvd, d, f, f, d};
  *in = ins[t];
  *out = outs[t];
}

// A slot's layout: the entry table [layers * kNumLoraTargets], then each present target's A
// [rank, in] and B [out, rank], every piece 256-byte aligned.
size_t TableBytes(int64_t layers) {
  return AlignUp256(static_cast<size_t>(layers) * kNumLoraTargets * sizeof(LoraDeviceEntry));
}
size_t PieceBytes(int64_t rows, int64_t cols, size_t elem) {
  return AlignUp256(static_cast<size_t>(rows) * static_cast<size_t>(cols) * elem);
}

}  // namespace

size_t DeviceLora::SlotBytes(const ModelConfig& config, const DeviceLoraOptions& options) {
  const size_t elem = DTypeSize(options.dtype);
  size_t bytes = TableBytes(config.num_layers);
  for (int t = 0; t < kNumLoraTargets; ++t) {
    int64_t in = 0, out = 0;
    ProjectionShape(config, t, &in, &out);
    bytes += static_cast<size_t>(config.num_layers) *
             (PieceBytes(options.max_rank, in, elem) + PieceBytes(out, options.max_rank, elem));
  }
  return bytes;
}

absl::StatusOr<std::unique_ptr<DeviceLora>> DeviceLora::Create(const ModelConfig& config,
                                                               const DeviceLoraOptions& options) {
  if (options.slots < 1 || options.max_rank < 1 || options.max_tokens < 1 ||
      (options.dtype != DType::kF32 && options.dtype != DType::kBF16)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoRA reservation: ", options.slots, " slots of rank ", options.max_rank,
                     " in ", std::string(DTypeName(options.dtype)), " for steps of ",
                     options.max_tokens, " tokens (slots, rank and tokens >= 1; f32 or bf16)"));
  }
  std::unique_ptr<DeviceLora> lora(new DeviceLora(config, options, SlotBytes(config, options)));
  TANDEM_RETURN_IF_ERROR(lora->slots_.Allocate(
      lora->slot_bytes_ * static_cast<size_t>(options.slots),
      absl::StrCat("LoRA adapters (", options.slots, " x ", lora->slot_bytes_ >> 20,
                   " MiB: --max-loras adapters of --max-lora-rank ", options.max_rank, ")")));
  for (int64_t s = options.slots - 1; s >= 0; --s) lora->free_slots_.push_back(s);
  TANDEM_RETURN_IF_ERROR(lora->step_.Allocate(
      AlignUp256(options.max_tokens * sizeof(int32_t)) + options.slots * sizeof(LoraDeviceGroup),
      "LoRA step inputs"));
  TANDEM_RETURN_IF_ERROR(lora->low_.Allocate(
      static_cast<size_t>(options.max_tokens * options.max_rank) * sizeof(float),
      "LoRA low-rank scratch"));
  return lora;
}

absl::Status DeviceLora::CheckShapes(const LoraAdapter& adapter) const {
  const ModelConfig& c = config_;
  if (static_cast<int64_t>(adapter.layers.size()) != c.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA adapter '", adapter.name, "' has ",
                                                   adapter.layers.size(), " layers, the model ",
                                                   c.num_layers));
  }
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (int t = 0; t < kNumLoraTargets; ++t) {
      const LoraMatrices& m = adapter.layers[l][t];
      if (!m.present()) continue;
      int64_t in = 0, out = 0;
      ProjectionShape(c, t, &in, &out);
      if (m.b == nullptr || m.in != in || m.out != out ||
          (m.dtype != DType::kF32 && m.dtype != DType::kBF16)) {
        return absl::InvalidArgumentError(
            absl::StrCat("LoRA adapter '", adapter.name, "': layer ", l, " ",
                         LoraTargetName(static_cast<LoraTarget>(t)), " is [", m.out, ", ", m.in,
                         "] ", std::string(DTypeName(m.dtype)), ", the model's projection is [",
                         out, ", ", in, "] (f32 or bf16 adapters)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status DeviceLora::Upload(const LoraAdapter& adapter, int64_t slot) {
  TANDEM_RETURN_IF_ERROR(CheckShapes(adapter));
  const int64_t entries = static_cast<int64_t>(adapter.layers.size()) * kNumLoraTargets;
  struct Piece {
    const void* src;
    size_t bytes, offset;
  };
  std::vector<Piece> pieces;
  size_t size = TableBytes(static_cast<int64_t>(adapter.layers.size()));
  std::vector<size_t> a_at(entries, 0), b_at(entries, 0);
  for (int64_t e = 0; e < entries; ++e) {
    const LoraMatrices& m = adapter.layers[e / kNumLoraTargets][e % kNumLoraTargets];
    if (!m.present()) continue;
    const size_t elem = DTypeSize(m.dtype);
    a_at[e] = size;
    pieces.push_back({m.a, adapter.rank * m.in * elem, size});
    size += PieceBytes(adapter.rank, m.in, elem);
    b_at[e] = size;
    pieces.push_back({m.b, m.out * adapter.rank * elem, size});
    size += PieceBytes(m.out, adapter.rank, elem);
  }
  if (size > slot_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("LoRA adapter '", adapter.name, "' (rank ", adapter.rank, ") needs ", size,
                     " bytes of device memory, a slot holds ", slot_bytes_, " (rank ",
                     options_.max_rank, " in ", std::string(DTypeName(options_.dtype)), ")"));
  }
  uint8_t* base = slots_.as<uint8_t>() + slot * slot_bytes_;
  upload_staging_.assign(size, 0);
  auto* table = reinterpret_cast<LoraDeviceEntry*>(upload_staging_.data());
  for (int64_t e = 0; e < entries; ++e) {
    const LoraMatrices& m = adapter.layers[e / kNumLoraTargets][e % kNumLoraTargets];
    table[e] = LoraDeviceEntry{};
    if (!m.present()) continue;
    table[e].a = base + a_at[e];
    table[e].b = base + b_at[e];
    table[e].bf16 = m.dtype == DType::kBF16 ? 1 : 0;
    table[e].rank = static_cast<int32_t>(adapter.rank);
  }
  for (const Piece& p : pieces) std::memcpy(upload_staging_.data() + p.offset, p.src, p.bytes);
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(base, upload_staging_.data(), size, cudaMemcpyHostToDevice),
      "cudaMemcpy (LoRA adapter upload)");
  ++uploads_;
  return absl::OkStatus();
}

absl::Status DeviceLora::Sweep(cudaStream_t stream, bool* synced) {
  for (auto it = resident_.begin(); it != resident_.end();) {
    if (!it->second.owner.expired()) {
      ++it;
      continue;
    }
    if (!*synced) {  // a launched step may still read it
      TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "cudaStreamSynchronize (LoRA)");
      *synced = true;
    }
    free_slots_.push_back(it->second.slot);
    it = resident_.erase(it);
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> DeviceLora::TakeSlot(const std::vector<const LoraAdapter*>& step,
                                             cudaStream_t stream, bool* synced) {
  if (!free_slots_.empty()) {
    const int64_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  auto victim = resident_.end();
  for (auto it = resident_.begin(); it != resident_.end(); ++it) {
    if (std::find(step.begin(), step.end(), it->first) != step.end()) continue;
    if (victim == resident_.end() || it->second.last_used < victim->second.last_used) victim = it;
  }
  if (victim == resident_.end()) {  // the caller checked the step's adapters against the slots
    return absl::InternalError("LoRA: no device slot to take");
  }
  if (!*synced) {  // a launched step may still read it
    TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "cudaStreamSynchronize (LoRA)");
    *synced = true;
  }
  const int64_t slot = victim->second.slot;
  resident_.erase(victim);
  return slot;
}

absl::StatusOr<bool> DeviceLora::Prepare(const ForwardBatch& b, int slot, int64_t padded_tokens,
                                         cudaStream_t stream) {
  tokens_ = 0;
  max_rank_ = 0;
  bool synced = false;
  TANDEM_RETURN_IF_ERROR(Sweep(stream, &synced));
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
  if (static_cast<int64_t>(groups.size()) > options_.slots) {
    return absl::ResourceExhaustedError(absl::StrCat("a step with ", groups.size(),
                                                     " LoRA adapters; the device holds ",
                                                     options_.slots, " (--max-loras)"));
  }

  ++steps_;
  for (const LoraAdapter* a : groups) {
    auto it = resident_.find(a);
    if (it == resident_.end()) {
      absl::StatusOr<int64_t> taken = TakeSlot(groups, stream, &synced);
      if (!taken.ok()) return taken.status();
      if (absl::Status st = Upload(*a, *taken); !st.ok()) {
        free_slots_.push_back(*taken);
        return st;
      }
      it = resident_.emplace(a, Resident{a->weak_from_this(), *taken, 0}).first;
    }
    it->second.last_used = steps_;
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
        LoraDeviceGroup{Table(resident_.at(a).slot), a->scale, static_cast<int32_t>(a->rank)};
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
