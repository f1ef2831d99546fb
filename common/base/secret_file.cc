#include "common/base/secret_file.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<std::string> ReadSecretFromFile(const std::string& path, absl::string_view what,
                                               size_t min_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " file ", path, " cannot be read"));
  std::stringstream s;
  s << in.rdbuf();
  std::string secret = s.str();
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.size() < min_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " file ", path, " holds ", secret.size(),
                                                   " bytes; at least ", min_bytes, " are needed"));
  }
  return secret;
}

}  // namespace tandem
