#pragma once

// Which (layer, block) regions one transfer moves. Without windowed layers every layer of every
// block; with them (Expectation / TransferTarget::window_layers, a window-layout pool whose
// sliding-window layers keep pages only for the blocks the next query can see) a windowed layer
// moves only blocks [window_first, n) of the block lists. Sender and receiver derive the same
// per-layer first block from the same fields.

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace tandem::kvtransfer {

// OK when `window_layers` are distinct layers in [0, num_layers) and `window_first` is in
// [0, num_blocks]; INVALID_ARGUMENT naming the bad value otherwise.
absl::Status ValidateTransferWindow(const std::vector<int64_t>& window_layers, int64_t window_first,
                                    int64_t num_layers, size_t num_blocks);

// Per layer, the index into the block lists of its first block moved (0, or window_first for a
// windowed layer). `window_layers` must be valid (ValidateTransferWindow).
std::vector<int32_t> FirstBlockPerLayer(const std::vector<int64_t>& window_layers,
                                        int32_t window_first, int64_t num_layers);

// The number of (layer, block) regions a transfer of `num_blocks` blocks moves.
int64_t TransferRegions(const std::vector<int64_t>& window_layers, int32_t window_first,
                        int64_t num_layers, size_t num_blocks);

}  // namespace tandem::kvtransfer
