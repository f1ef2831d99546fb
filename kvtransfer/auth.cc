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
constexpr absl::string_view kBeginLabel = "tandem kvtransfer v3 begin proof";

absl::Status RandomBytes(void* out, size_t n) {
  if (RAND_bytes(static_cast<unsigned char*>(out), static_cast<int>(n)) != 1) {
    return absl::InternalError("kv transfer: the random number generator failed");
  }
  return absl::OkStatus();
}

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
  if (absl::Status s = RandomBytes(nonce.data(), nonce.size()); !s.ok()) return s;
  return nonce;
}

absl::StatusOr<uint64_t> NewTransferId() {
  uint64_t id = 0;
  while (id == 0) {
    if (absl::Status s = RandomBytes(&id, sizeof id); !s.ok()) return s;
  }
  return id;
}

absl::StatusOr<std::string> NewTransferKey() {
  std::string key(kTransferKeyBytes, '\0');
  if (absl::Status s = RandomBytes(key.data(), key.size()); !s.ok()) return s;
  return key;
}

std::string BeginProof(absl::string_view key, absl::string_view binding, uint64_t transfer_id,
                       uint32_t attempt, absl::Span<const int32_t> dst_blocks) {
  std::string ids(12, '\0');
  for (int i = 0; i < 8; ++i) ids[i] = static_cast<char>(transfer_id >> (8 * i));
  for (int i = 0; i < 4; ++i) ids[8 + i] = static_cast<char>(attempt >> (8 * i));
  std::string blocks;
  blocks.reserve(dst_blocks.size() * 4);
  for (int32_t b : dst_blocks) {
    for (int i = 0; i < 4; ++i)
      blocks.push_back(static_cast<char>(static_cast<uint32_t>(b) >> (8 * i)));
  }
  return Hmac(key, kBeginLabel, binding, ids, blocks);
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
