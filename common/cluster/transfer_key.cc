#include "common/cluster/transfer_key.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

namespace tandem {

std::string TransferAttemptKey(absl::string_view transfer_key, uint32_t attempt) {
  if (transfer_key.empty()) return "";
  constexpr absl::string_view kLabel = "tandem kvtransfer attempt key";
  std::string input(kLabel);
  for (int i = 0; i < 4; ++i) input.push_back(static_cast<char>(attempt >> (8 * i)));
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), transfer_key.data(), static_cast<int>(transfer_key.size()),
       reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac, &len);
  return std::string(reinterpret_cast<const char*>(mac), len);
}

}  // namespace tandem
