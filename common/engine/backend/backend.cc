#include "common/engine/backend/backend.h"

namespace tandem {

void ForwardBatch::AddSequence(const std::vector<int32_t>& tokens, int32_t start_pos,
                               const std::vector<int32_t>& block_table, int64_t block_size,
                               bool want_last_logits) {
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
  if (want_last_logits && !tokens.empty()) {
    logit_rows.push_back(seq.token_begin + seq.num_tokens - 1);
  }
  seqs.push_back(std::move(seq));
}

}  // namespace tandem
