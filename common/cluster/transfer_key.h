#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace tandem {

// The key that proves one attempt of a KV transfer (kvtransfer README, "Transfer ids and the
// sender binding"). The decode worker draws one random key per transfer (its reservation) and
// keeps it; the router gives the prefill worker it names for attempt N only
// TransferAttemptKey(key, N), and the receiver checks the BEGIN of attempt N against the same
// derivation. A worker named for one attempt thus cannot begin another: not a later one (which
// would supersede the sender the router named next), not an earlier one. HMAC-SHA256(key,
// label || attempt), as many bytes as the key's MAC (32); empty for an empty key (an
// expectation without a key takes any sender).
std::string TransferAttemptKey(absl::string_view transfer_key, uint32_t attempt);

}  // namespace tandem
