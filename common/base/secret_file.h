#pragma once

// Shared secrets kept in files (the KV secret, the cluster secret).

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// The bytes of the file at `path`, trailing newlines dropped. NOT_FOUND when it cannot be read,
// INVALID_ARGUMENT when shorter than `min_bytes`; `what` names the secret in both messages
// ("kv secret").
absl::StatusOr<std::string> ReadSecretFromFile(const std::string& path, absl::string_view what,
                                               size_t min_bytes);

}  // namespace tandem
