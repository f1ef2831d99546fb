#pragma once

// Helpers on KvLayout beyond CheckCompatible (declared in transport.h).

#include <string>

#include "absl/status/status.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer {

// INVALID_ARGUMENT unless every dimension is positive and the dtype is a KV dtype.
absl::Status ValidateLayout(const KvLayout& layout);

std::string LayoutDebugString(const KvLayout& layout);

}  // namespace tandem::kvtransfer
