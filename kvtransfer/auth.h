#pragma once

// Per-connection authentication of the TCP data path with a shared secret (README.md,
// "Authentication"): an HMAC-SHA256 challenge-response inside the HELLO/WELCOME handshake.
// The receiver proves it knows the secret too, so a sender never feeds KV to an impostor.
// Only the handshake is authenticated; the KV bytes themselves are not encrypted.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tandem::kvtransfer {

inline constexpr size_t kAuthNonceBytes = 32;
inline constexpr size_t kAuthMacBytes = 32;  // HMAC-SHA256
inline constexpr size_t kMinSecretBytes = 16;

// The secret in `path`: its bytes, less trailing newlines / carriage returns. NOT_FOUND when it
// cannot be read, INVALID_ARGUMENT when shorter than kMinSecretBytes.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

// kAuthNonceBytes fresh random bytes (OpenSSL RAND_bytes); INTERNAL if the generator fails.
absl::StatusOr<std::string> NewNonce();

// The sender's answer to a challenge: HMAC(secret, "sender" label || receiver_nonce ||
// sender_nonce || hello), `hello` being the HELLO metadata exactly as sent.
std::string SenderProof(absl::string_view secret, absl::string_view receiver_nonce,
                        absl::string_view sender_nonce, absl::string_view hello);
// The receiver's proof in its WELCOME: HMAC(secret, "receiver" label || sender_nonce ||
// receiver_nonce || welcome), `welcome` being the WELCOME metadata with an empty proof. The
// labels keep one side's proof from being replayed as the other's.
std::string ReceiverProof(absl::string_view secret, absl::string_view sender_nonce,
                          absl::string_view receiver_nonce, absl::string_view welcome);

// The nccl and cuda-ipc transports' control messages (carried by kvtransfer/control_rpc inside
// the TLS of the worker's listeners): a request's proof HMAC(secret, "control request" label ||
// unix_ms || nonce || request), so that the receiver can refuse a request outside its time
// window or seen before; the reply's HMAC(secret, "control reply" label || request proof ||
// reply), which binds each reply to its request so a reply cannot be replayed onto another.
std::string ControlRequestProof(absl::string_view secret, int64_t unix_ms, absl::string_view nonce,
                                absl::string_view request);
std::string ControlReplyProof(absl::string_view secret, absl::string_view request_proof,
                              absl::string_view reply);

// Transfers (README.md, "Transfer ids and the sender binding"): a decode worker gives every
// reservation an id and a key, both from OpenSSL's CSPRNG. The id names the transfer and is
// unguessable (nothing about it follows from the incarnation or from other ids); the key travels
// only to the router, which gives the prefill worker it names for attempt N only that attempt's
// key (TransferAttemptKey), proven in BEGIN. INTERNAL if the generator fails.
inline constexpr size_t kTransferKeyBytes = 32;
absl::StatusOr<uint64_t> NewTransferId();  // never 0
absl::StatusOr<std::string> NewTransferKey();
// BEGIN's proof that the sender holds its attempt's key (`key`: TransferAttemptKey of the
// transfer's key and `attempt`, common/cluster/transfer_key.h): HMAC(key, "begin" label ||
// binding || transfer id, attempt, destination blocks). `binding` ties it to the link it is sent
// on: tcp, the connection's two handshake nonces (empty without a shared secret); nccl and
// cuda-ipc, the sender's id; loopback, empty.
std::string BeginProof(absl::string_view key, absl::string_view binding, uint64_t transfer_id,
                       uint32_t attempt, absl::Span<const int32_t> dst_blocks);

// Constant-time comparison (CRYPTO_memcmp); false when the sizes differ or `expected` is empty.
bool ProofMatches(absl::string_view got, absl::string_view expected);

}  // namespace tandem::kvtransfer
