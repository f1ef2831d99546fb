#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/dtype.h"
#include "common/base/kv_layout.h"
#include "common/engine/sampler/device_sample.h"

namespace tandem {

struct LoraAdapter;  // common/engine/lora/lora_adapter.h

// Shape of the paged KV pool. Block b of layer l is one contiguous region of
// bytes_per_block_layer() bytes laid out [2 (K, V)][num_kv_heads][block_size][head_dim] (plus
// per-row scales for the quantized dtypes, common/base/kv_layout.h).
//
// Window layout (windowed(): models whose sliding-window layers alternate with global ones, as
// Gemma 2 / 3): a block id names a *page* of `page_layers` layer regions (one per global layer).
// Global layers (layer_group 0) keep every block of a sequence, in the pages of its block table;
// local layers are split into groups of at most page_layers (layer_group g >= 1) whose KV lives
// in pages of the sequence's local table g - 1 (ForwardSeq::local_tables), held only for the
// blocks a query can still see (the last `sliding_window` positions). Layer l is slot
// layer_slot[l] of its page. Without it every layer is a slot of the block's own page.
struct KvCacheSpec {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 16;
  DType dtype = DType::kF32;
  int64_t num_blocks = 0;
  int64_t sliding_window = 0;        // window layout only
  std::vector<int32_t> layer_group;  // [num_layers]; empty: no window layout
  std::vector<int32_t> layer_slot;   // [num_layers]
  int64_t page_layers = 0;           // layer regions per page (window layout)

  bool windowed() const { return !layer_group.empty(); }
  int64_t num_local_groups() const;
  int64_t slots_per_page() const { return windowed() ? page_layers : num_layers; }
  size_t bytes_per_block_layer() const {
    return KvRegionBytes(num_kv_heads, block_size, head_dim, dtype);
  }
  // Bytes of one page (block id) of the pool.
  size_t bytes_per_block() const { return bytes_per_block_layer() * slots_per_page(); }
};

// Sets the window layout of `spec` (num_layers set) for a model whose layers are local where
// sliding_layers[l] != 0, when it has both local and global layers and a window; otherwise
// leaves `spec` without one.
void SetWindowLayout(const std::vector<uint8_t>& sliding_layers, int64_t sliding_window,
                     KvCacheSpec* spec);

// One sequence's slice of a step (DESIGN §4 "Batch form").
struct ForwardSeq {
  int32_t token_begin = 0;           // first index into ForwardBatch's per-token arrays
  int32_t num_tokens = 0;            // tokens this sequence contributes to the step
  std::vector<int32_t> block_table;  // block ids covering positions [0, last position]
  // Window layout only (KvCacheSpec::windowed): per local group, the pages parallel to
  // block_table; -1 for blocks outside every window of this chunk's queries.
  std::vector<std::vector<int32_t>> local_tables;
  // The LoRA adapter whose low-rank terms this sequence's projections add (null: the base
  // model). Only backends whose CheckLora() allows it take one; it outlives the Forward call.
  const LoraAdapter* lora = nullptr;
};

// The second pool a step's block ids from kKvRemoteBlock on name (kv_layout.h): a decode
// worker's pool mapped for a zero-copy KV transfer. Block kKvRemoteBlock + b of layer l is the
// region at layer_base[l] + b * KvCacheSpec::bytes_per_block_layer(), b < num_blocks. Whoever
// sets it keeps the mapping open (`mapping`) while a step may write there.
struct RemoteKvPool {
  std::vector<uint8_t*> layer_base;  // [num_layers]
  int64_t num_blocks = 0;
  std::shared_ptr<const void> mapping;
};

// A ragged batch: every scheduled sequence's next chunk, concatenated.
struct ForwardBatch {
  std::vector<int32_t> token_ids;     // [T]
  std::vector<int32_t> positions;     // [T] position of each token in its sequence
  std::vector<int64_t> slots;         // [T] KV slot = block * block_size + offset
  std::vector<int32_t> seq_of_token;  // [T] index into seqs
  std::vector<ForwardSeq> seqs;
  std::vector<int32_t> logit_rows;  // token indices whose logits are wanted, in output order
  // Called after layer l's KV of this step is written (layer-wise KV push); may be empty.
  std::function<void(int64_t layer)> on_layer_done;
  // Block ids tagged kKvRemoteBlock name blocks of this pool (one per step); null: none may.
  // Only a backend whose SupportsRemoteKv() takes one.
  std::shared_ptr<const RemoteKvPool> remote_kv;

  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  // Appends a sequence chunk: tokens at positions [start_pos, start_pos + tokens.size()).
  void AddSequence(const std::vector<int32_t>& tokens, int32_t start_pos,
                   const std::vector<int32_t>& block_table, int64_t block_size,
                   bool want_last_logits) {
    AddSequenceRows(tokens, start_pos, block_table, block_size, want_last_logits ? 1 : 0);
  }
  // Like AddSequence, with logits for the last `logit_rows` tokens (speculative verification).
  void AddSequenceRows(const std::vector<int32_t>& tokens, int32_t start_pos,
                       const std::vector<int32_t>& block_table, int64_t block_size,
                       int64_t logit_rows);
};

// Checks that every index a backend follows in `batch` stays in range: per-token arrays of one
// length, token ids inside the vocabulary, positions below `max_positions`, KV slots and block ids
// inside the pool of `spec` (or, tagged kKvRemoteBlock, inside batch.remote_kv), block tables
// covering each token's position (window layout: local tables covering each token's window),
// sequence token ranges that tile the batch in order and agree with seq_of_token, logit rows inside
// the batch.
absl::Status ValidateForwardBatch(const ForwardBatch& batch, const KvCacheSpec& spec,
                                  int64_t vocab_size, int64_t max_positions);

// Host memory a backend allocated (Backend::AllocateHostMemory), freed with its last reference.
struct HostMemory {
  std::shared_ptr<uint8_t> data;
  size_t bytes = 0;
  bool pinned = false;  // page-locked: the backend's block copies DMA straight to and from it
};

// A token of a launched step's batch whose id is not known on the host yet: the token the
// previous launched step samples on the device for its samples[sample_index] (overlapped steps,
// common/engine/README.md). The batch holds any valid id there; the device's replaces it.
struct DeviceTokenInput {
  int32_t token_index = 0;   // into ForwardBatch::token_ids
  int32_t sample_index = 0;  // into the previous LaunchStep's samples
};

// The compute device behind the engine: runs forward passes and owns the KV pool's storage.
// Not thread-safe: one engine thread calls it.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const KvCacheSpec& kv_spec() const = 0;
  virtual int64_t vocab_size() const = 0;
  // Whether Forward honours ForwardSeq::lora for steps of up to `max_loras` distinct adapters of
  // rank <= max_rank kept in `dtype`: OK, or why not (a backend that cannot refuses a batch with
  // one). A backend keeping adapters in device memory reserved it when it was made (the CUDA
  // backend's LoRA slots), so that no step fails for want of memory for an adapter.
  virtual absl::Status CheckLora(int64_t max_loras, int64_t max_rank, DType dtype) const {
    return absl::UnimplementedError("this backend has no LoRA path");
  }

  // Runs the batch; writes logits f32 [batch.logit_rows.size(), vocab_size()] to `logits`.
  virtual absl::Status Forward(const ForwardBatch& batch, float* logits) = 0;

  // Sampling on the device (common/engine/README.md, "Sampling on the device"): whether
  // ForwardSampled is available.
  virtual bool SupportsDeviceSampling() const { return false; }
  // Runs the batch like Forward and samples the logit rows `samples` name (distinct rows) where
  // the logits are, as the host sampler would (DeviceSampleRow): (*results)[i] answers
  // samples[i]. `logits` receives only the other rows, f32 [rows not named, vocab_size()] in
  // logit_rows order. Unimplemented unless SupportsDeviceSampling().
  virtual absl::Status ForwardSampled(const ForwardBatch& batch,
                                      const std::vector<DeviceSampleRow>& samples, float* logits,
                                      std::vector<DeviceSample>* results);

  // Overlapped steps (common/engine/README.md, "Overlapped steps"): whether LaunchStep and
  // CollectStep are available.
  virtual bool SupportsAsyncSteps() const { return false; }
  // Enqueues the batch and the device sampling of `samples` as ForwardSampled does, and returns
  // without waiting for the device. `device_tokens` take their ids from the previous launched
  // step's samples (on the device; that step need not be collected). At most two steps are
  // launched and not collected; Forward and ForwardSampled refuse to run while one is.
  // Unimplemented unless SupportsAsyncSteps().
  virtual absl::Status LaunchStep(const ForwardBatch& batch,
                                  const std::vector<DeviceSampleRow>& samples,
                                  const std::vector<DeviceTokenInput>& device_tokens);
  // Waits for the oldest launched step and returns what ForwardSampled would have: `logits` the
  // rows not sampled on the device, `results` the samples. The wait is for that step only (an
  // event), not for steps launched after it.
  virtual absl::Status CollectStep(float* logits, std::vector<DeviceSample>* results);
  // Steps launched and not collected.
  virtual int pending_steps() const { return 0; }

  // Whether Forward takes ForwardBatch::remote_kv (block ids tagged kKvRemoteBlock).
  virtual bool SupportsRemoteKv() const { return false; }

  // Copies every layer of block `src` into block `dst` (copy-on-write).
  virtual void CopyBlock(int32_t src, int32_t dst) = 0;

  // Host access to one (layer, block) region for KV transfer. Backends whose pool is not host
  // memory return nullptr and implement the staging calls below.
  virtual uint8_t* HostBlockRegion(int64_t layer, int32_t block) = 0;
  virtual absl::Status ReadBlockRegion(int64_t layer, int32_t block, uint8_t* dst) = 0;
  virtual absl::Status WriteBlockRegion(int64_t layer, int32_t block, const uint8_t* src) = 0;

  // Host memory for the buffers the whole-block copies below read and write (the KV host tier):
  // page-locked on a backend whose pool is device memory, so that those copies DMA straight to and
  // from it; ordinary memory elsewhere (the default). RESOURCE_EXHAUSTED when that much cannot be
  // had. Called at start; the memory may outlive the backend (freed with its last reference).
  virtual absl::StatusOr<HostMemory> AllocateHostMemory(size_t bytes);

  // Whole-block copies that do not wait on the host, for backends whose pool is not host memory
  // (the KV tiers' copy-out at eviction and their installs). A block's bytes are its layers'
  // regions one after another, each as ReadBlockRegion gives it. StartBlockRead enqueues the copy
  // of `block` into `dst` behind the work enqueued before it (the block may be reused at once);
  // StartBlockWrite enqueues the copy of `src` into `block` ahead of every later forward pass.
  // Host memory from AllocateHostMemory is copied by DMA directly: `dst` is written, and `src`
  // read, until the copy has landed, so the caller neither reads, changes nor frees it before.
  // Other memory goes through a staging slot: `src` is taken at once, `dst` filled when the poll
  // finds the copy landed. Each returns a ticket, or nullopt when no staging slot is free (the
  // caller does without: drops the copy-out, writes synchronously). PollBlockCopy says whether the
  // copy landed and then ends the ticket (false while in flight; `wait` waits for it, on its own
  // event, never the stream); every ticket is polled until it has. Engine thread only.
  virtual bool SupportsAsyncBlockCopies() const { return false; }
  virtual std::optional<uint64_t> StartBlockRead(int32_t /*block*/, uint8_t* /*dst*/) {
    return std::nullopt;
  }
  virtual std::optional<uint64_t> StartBlockWrite(int32_t /*block*/, const uint8_t* /*src*/) {
    return std::nullopt;
  }
  virtual absl::StatusOr<bool> PollBlockCopy(uint64_t /*ticket*/, bool /*wait*/) {
    return absl::UnimplementedError("asynchronous block copies");
  }

  // Window layout: the page holding local group `group`'s (>= 1) layers for block `block`, or
  // -1 when none does (its region then reads as zeros). Only what the (layer, block) regions
  // above resolve to for the KV transport; forward passes take the sequences' local tables.
  // Called on the engine thread; blocks taking part in a transfer keep their mapping.
  virtual void MapLocalPage(int32_t block, int64_t group, int32_t page) {}
};

}  // namespace tandem
