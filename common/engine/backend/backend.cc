#include "common/engine/backend/backend.h"

#include <algorithm>
#include <new>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<HostMemory> Backend::AllocateHostMemory(size_t bytes) {
  HostMemory m;
  if (bytes == 0) return m;
  auto* p = new (std::nothrow) uint8_t[bytes];  // not touched: pages come as they are used
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
  }
  m.data = std::shared_ptr<uint8_t>(p, std::default_delete<uint8_t[]>());
  m.bytes = bytes;
  return m;
}

int64_t KvCacheSpec::num_local_groups() const {
  int64_t groups = 0;
  for (int32_t g : layer_group) groups = std::max<int64_t>(groups, g);
  return groups;
}

void SetWindowLayout(const std::vector<uint8_t>& sliding_layers, int64_t sliding_window,
                     KvCacheSpec* spec) {
  spec->layer_group.clear();
  spec->layer_slot.clear();
  spec->page_layers = 0;
  spec->sliding_window = 0;
  if (sliding_window <= 0 || static_cast<int64_t>(sliding_layers.size()) != spec->num_layers) {
    return;
  }
  int32_t global = 0, local = 0;
  for (uint8_t s : sliding_layers) (s != 0 ? local : global) += 1;
  if (global == 0 || local == 0) return;
  spec->sliding_window = sliding_window;
  spec->page_layers = global;
  int32_t g = 0, l = 0;
  for (uint8_t s : sliding_layers) {
    if (s != 0) {
      spec->layer_group.push_back(1 + l / global);
      spec->layer_slot.push_back(l % global);
      ++l;
    } else {
      spec->layer_group.push_back(0);
      spec->layer_slot.push_back(g++);
    }
  }
}

void ForwardBatch::AddSequenceRows(const std::vector<int32_t>& tokens, int32_t start_pos,
                                   const std::vector<int32_t>& block_table, int64_t block_size,
                                   int64_t logit_rows) {
  ForwardSeq seq;
  seq.token_begin = static_cast<int32_t>(token_ids.size());
  seq.num_tokens = static_cast<int32_t>(tokens.size());
  seq.block_table = block_table;
  const int32_t seq_index = static_cast<int32_t>(seqs.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t pos = start_pos + static_cast<int32_t>(i);
    token_ids.push_back(tokens[i]);
    positions.push_back(pos);
    slots.push_back(static_cast<int64_t>(block_table[pos / block_size]) * block_size +
                    pos % block_size);
    seq_of_token.push_back(seq_index);
  }
  const int64_t rows = std::min<int64_t>(logit_rows, seq.num_tokens);
  for (int64_t r = seq.num_tokens - rows; r < seq.num_tokens; ++r) {
    this->logit_rows.push_back(seq.token_begin + static_cast<int32_t>(r));
  }
  seqs.push_back(std::move(seq));
}

absl::Status Backend::ForwardSampled(const ForwardBatch& batch,
                                     const std::vector<DeviceSampleRow>& samples, float* logits,
                                     std::vector<DeviceSample>* results) {
  return absl::UnimplementedError(name() + " backend does not sample on the device");
}

absl::Status Backend::LaunchStep(const ForwardBatch& batch,
                                 const std::vector<DeviceSampleRow>& samples,
                                 const std::vector<DeviceTokenInput>& device_tokens) {
  return absl::UnimplementedError(name() + " backend does not launch steps asynchronously");
}

absl::Status Backend::CollectStep(float* logits, std::vector<DeviceSample>* results) {
  return absl::UnimplementedError(name() + " backend does not launch steps asynchronously");
}

namespace {

// Whether `block` is a tagged id of the batch's remote pool, inside it.
bool RemoteBlockInRange(const ForwardBatch& b, int64_t block) {
  return block >= kKvRemoteBlock && b.remote_kv != nullptr &&
         block - kKvRemoteBlock < b.remote_kv->num_blocks;
}

}  // namespace

absl::Status ValidateForwardBatch(const ForwardBatch& b, const KvCacheSpec& spec,
                                  int64_t vocab_size, int64_t max_positions) {
  const int64_t t = b.num_tokens();
  if (static_cast<int64_t>(b.positions.size()) != t || static_cast<int64_t>(b.slots.size()) != t ||
      static_cast<int64_t>(b.seq_of_token.size()) != t) {
    return absl::InvalidArgumentError("forward batch: per-token arrays differ in length");
  }
  const int64_t capacity = spec.num_blocks * spec.block_size;
  for (int64_t i = 0; i < t; ++i) {
    if (b.token_ids[i] < 0 || b.token_ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", b.token_ids[i], " outside the vocabulary [0, ", vocab_size, ")"));
    }
    if (b.positions[i] < 0 || b.positions[i] >= max_positions) {
      return absl::InvalidArgumentError(
          absl::StrCat("position ", b.positions[i], " outside [0, ", max_positions, ")"));
    }
    if (b.slots[i] >= capacity && !RemoteBlockInRange(b, b.slots[i] / spec.block_size)) {
      return absl::InvalidArgumentError("KV slot out of range");
    }
    const int32_t s = b.seq_of_token[i];
    if (s < 0 || s >= static_cast<int32_t>(b.seqs.size())) {
      return absl::InvalidArgumentError("token refers to no sequence");
    }
    const int64_t needed = b.positions[i] / spec.block_size + 1;
    if (static_cast<int64_t>(b.seqs[s].block_table.size()) < needed) {
      return absl::InvalidArgumentError("block table does not cover the token's position");
    }
  }
  if (b.remote_kv != nullptr &&
      static_cast<int64_t>(b.remote_kv->layer_base.size()) != spec.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("remote KV pool has ",
                                                   b.remote_kv->layer_base.size(),
                                                   " layer bases, the model ", spec.num_layers));
  }
  if (b.remote_kv != nullptr) {
    for (const uint8_t* base : b.remote_kv->layer_base) {
      if (base == nullptr) return absl::InvalidArgumentError("remote KV pool without a base");
    }
  }
  int64_t covered = 0;
  const int64_t groups = spec.windowed() ? spec.num_local_groups() : 0;
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    const ForwardSeq& seq = b.seqs[s];
    if (static_cast<int64_t>(seq.local_tables.size()) != groups) {
      return absl::InvalidArgumentError(absl::StrCat("sequence has ", seq.local_tables.size(),
                                                     " local block tables, the pool ", groups));
    }
    if (groups > 0 && seq.num_tokens > 0 && seq.token_begin >= 0 && seq.token_begin < t) {
      // Every page a query of this chunk reads or writes: from the first query's window start
      // to the last position.
      const int64_t first_key =
          std::max<int64_t>(0, b.positions[seq.token_begin] - spec.sliding_window + 1);
      const int64_t last_block =
          b.positions[std::min<int64_t>(t, int64_t{seq.token_begin} + seq.num_tokens) - 1] /
          spec.block_size;
      for (const std::vector<int32_t>& table : seq.local_tables) {
        if (static_cast<int64_t>(table.size()) <= last_block) {
          return absl::InvalidArgumentError("local block table does not cover the chunk");
        }
        for (int64_t i = first_key / spec.block_size; i <= last_block; ++i) {
          if (table[i] < 0 || table[i] >= spec.num_blocks) {
            return absl::InvalidArgumentError(
                absl::StrCat("local page ", table[i], " for block ", i, " out of range"));
          }
        }
      }
    }
    if (seq.token_begin < 0 || seq.num_tokens < 0 ||
        int64_t{seq.token_begin} + seq.num_tokens > t) {
      return absl::InvalidArgumentError("sequence token range outside the batch");
    }
    for (int32_t i = seq.token_begin; i < seq.token_begin + seq.num_tokens; ++i) {
      if (b.seq_of_token[i] != static_cast<int32_t>(s)) {
        return absl::InvalidArgumentError("sequence token ranges disagree with seq_of_token");
      }
    }
    covered += seq.num_tokens;
    for (int32_t block : seq.block_table) {
      if (block < 0 || (block >= spec.num_blocks && !RemoteBlockInRange(b, block))) {
        return absl::InvalidArgumentError(absl::StrCat("block id ", block, " out of range"));
      }
    }
  }
  if (covered != t) {
    return absl::InvalidArgumentError("sequence token ranges do not cover the batch");
  }
  for (int32_t r : b.logit_rows) {
    if (r < 0 || r >= t) return absl::InvalidArgumentError("logit row out of range");
  }
  return absl::OkStatus();
}

}  // namespace tandem
