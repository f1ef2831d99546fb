#include "kvtransfer/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "absl/strings/str_cat.h"
#include "common/base/secret_file.h"

namespace tandem::kvtransfer {
namespace {

constexpr absl::string_view kSenderLabel = "tandem kvtransfer v2 sender proof";
constexpr absl::string_view kReceiverLabel = "tandem kvtransfer v2 receiver proof";
constexpr absl::string_view kControlRequestLabel = "tandem kvtransfer control request";
constexpr absl::string_view kControlReplyLabel = "tandem kvtransfer control reply";

std::string Hmac(absl::string_view secret, absl::string_view label, absl::string_view a,
                 absl::string_view b, absl::string_view message) {
  // The parts are length-prefixed (u32 little-endian) so no two inputs concatenate alike.
  std::string input;
  for (absl::string_view part : {label, a, b, message}) {
    const uint32_t n = static_cast<uint32_t>(part.size());
    input.append(reinterpret_cast<const char*>(&n), sizeof n);
    input.append(part.data(), part.size());
  }
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac, &len);
  return std::string(reinterpret_cast<const char*>(mac), len);
}

}  // namespace

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  return ReadSecretFromFile(path, "kv secret", kMinSecretBytes);
}

absl::StatusOr<std::string> NewNonce() {
  std::string nonce(kAuthNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), kAuthNonceBytes) != 1) {
    return absl::InternalError("kv transfer: the random number generator failed");
  }
  return nonce;
}

std::string SenderProof(absl::string_view secret, absl::string_view receiver_nonce,
                        absl::string_view sender_nonce, absl::string_view hello) {
  return Hmac(secret, kSenderLabel, receiver_nonce, sender_nonce, hello);
}

std::string ReceiverProof(absl::string_view secret, absl::string_view sender_nonce,
                          absl::string_view receiver_nonce, absl::string_view welcome) {
  return Hmac(secret, kReceiverLabel, sender_nonce, receiver_nonce, welcome);
}

std::string ControlRequestProof(absl::string_view secret, int64_t unix_ms, absl::string_view nonce,
                                absl::string_view request) {
  char ms[8];
  for (int i = 0; i < 8; ++i) ms[i] = static_cast<char>(static_cast<uint64_t>(unix_ms) >> (8 * i));
  return Hmac(secret, kControlRequestLabel, absl::string_view(ms, 8), nonce, request);
}

std::string ControlReplyProof(absl::string_view secret, absl::string_view request_proof,
                              absl::string_view reply) {
  return Hmac(secret, kControlReplyLabel, request_proof, "", reply);
}

bool ProofMatches(absl::string_view got, absl::string_view expected) {
  return !expected.empty() && got.size() == expected.size() &&
         CRYPTO_memcmp(got.data(), expected.data(), got.size()) == 0;
}

}  // namespace tandem::kvtransfer
