#pragma once

#include <string>
#include <string_view>

namespace tandem {

// `prefix` followed by 32 lowercase hex digits: 128 bits from OpenSSL's CSPRNG (RAND_bytes).
// Server-made request ids (the router's gRPC ids, HTTP completion ids, the internal ids the
// router sends to workers) come from here, so no client can predict another client's next id.
// Thread-safe. Aborts the process if the generator fails (a server without randomness must not
// hand out guessable ids).
std::string RandomRequestId(std::string_view prefix);

}  // namespace tandem
