#include "common/engine/backend/backend.h"

#include <algorithm>

namespace tandem {

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

}  // namespace tandem
