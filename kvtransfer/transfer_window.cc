#include "kvtransfer/transfer_window.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer {

absl::Status ValidateTransferWindow(const std::vector<int64_t>& window_layers, int64_t window_first,
                                    int64_t num_layers, size_t num_blocks) {
  if (window_first < 0 || window_first > static_cast<int64_t>(num_blocks)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "window_first ", window_first, " outside the transfer's blocks [0, ", num_blocks, "]"));
  }
  std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(0, num_layers)), false);
  for (int64_t l : window_layers) {
    if (l < 0 || l >= num_layers) {
      return absl::InvalidArgumentError(
          absl::StrCat("window_layers: ", l, " outside the model's layers [0, ", num_layers, ")"));
    }
    if (seen[l]) {
      return absl::InvalidArgumentError(absl::StrCat("window_layers: ", l, " listed twice"));
    }
    seen[l] = true;
  }
  return absl::OkStatus();
}

std::vector<int32_t> FirstBlockPerLayer(const std::vector<int64_t>& window_layers,
                                        int32_t window_first, int64_t num_layers) {
  std::vector<int32_t> first(static_cast<size_t>(std::max<int64_t>(0, num_layers)), 0);
  for (int64_t l : window_layers) first[l] = window_first;
  return first;
}

int64_t TransferRegions(const std::vector<int64_t>& window_layers, int32_t window_first,
                        int64_t num_layers, size_t num_blocks) {
  return num_layers * static_cast<int64_t>(num_blocks) -
         static_cast<int64_t>(window_layers.size()) * window_first;
}

}  // namespace tandem::kvtransfer
