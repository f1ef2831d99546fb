#include "router/http/request_id.h"

#include <openssl/rand.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace tandem {

std::string RandomRequestId(std::string_view prefix) {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof bytes) != 1) {
    std::fprintf(stderr, "RAND_bytes failed: no random request ids\n");
    std::abort();
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(prefix);
  id.reserve(prefix.size() + 2 * sizeof bytes);
  for (unsigned char b : bytes) {
    id += kHex[b >> 4];
    id += kHex[b & 15];
  }
  return id;
}

}  // namespace tandem
