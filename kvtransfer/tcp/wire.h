#pragma once

// The TCP transport's wire format (README.md, "Wire protocol"). Every message is a 16-byte
// prefix and a metadata block protected by its own CRC32C; DATA adds a payload of whole KV
// regions and, with kFlagChecksum, a u32 CRC32C of the payload after it (a trailer, so both
// sides checksum each piece while it is still in cache). Integers are little-endian.
//
//   prefix:  u32 magic "TKVF" | u16 type | u16 flags | u32 meta_len | u32 meta_crc32c
//   DATA:    prefix | metadata | payload (payload_len bytes) | [u32 payload_crc32c]
//
// The prefix and HELLO layouts never change, so any two versions can at least tell each other
// that their protocol versions differ.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer::wire {

inline constexpr uint32_t kFrameMagic = 0x46564b54;  // "TKVF"
inline constexpr uint32_t kHelloMagic = 0x4d444e54;  // "TNDM"
inline constexpr size_t kPrefixBytes = 16;
inline constexpr uint32_t kMaxMetaBytes = 16u << 20;  // block lists and trailers
// Both ends move block payloads through a scratch buffer of kScratchBytes, at most kBytesPerCall
// per send/recv call (checksummed while still in cache).
inline constexpr size_t kScratchBytes = 256 << 10;
inline constexpr size_t kBytesPerCall = 512 << 10;
inline constexpr uint16_t kFlagChecksum = 1;  // DATA: a u32 CRC32C of the payload follows it

enum class FrameType : uint16_t {
  kHello = 1,      // sender -> receiver, first message: protocol version and KvLayout
  kWelcome = 2,    // receiver -> sender: accepted; the receiver's incarnation and KvLayout
  kRefuse = 3,     // receiver -> sender: refused (message names the field); then close
  kBegin = 4,      // sender: an attempt starts (ids, incarnation, deadline, destination blocks)
  kData = 5,       // sender: regions of one layer, payload follows the metadata
  kFinish = 6,     // sender: attempt complete (message/byte counts, trailer)
  kAbort = 7,      // sender: attempt abandoned (deadline, abort)
  kResult = 8,     // receiver: an attempt's outcome (OK after FINISH, or why it failed)
  kChallenge = 9,  // receiver -> sender, after HELLO when it has a secret: a fresh nonce
  kAuth = 10,      // sender -> receiver: its nonce and proof of the secret (empty: none)
};
const char* FrameTypeName(FrameType type);

struct Prefix {
  FrameType type = FrameType::kHello;
  uint16_t flags = 0;
  uint32_t meta_len = 0;
  uint32_t meta_crc = 0;
};

void EncodePrefix(const Prefix& prefix, uint8_t out[kPrefixBytes]);
// DATA_LOSS when the magic or type is wrong or meta_len is absurd: the stream is unusable.
absl::StatusOr<Prefix> DecodePrefix(const uint8_t in[kPrefixBytes]);
// DATA_LOSS when `meta` does not match prefix.meta_crc.
absl::Status VerifyMeta(const Prefix& prefix, absl::string_view meta);

struct Hello {
  uint32_t magic = kHelloMagic;
  KvLayout layout;  // layout.protocol_version is the sender's protocol version
};
struct Welcome {
  uint64_t incarnation = 0;
  KvLayout layout;
  // With a shared secret: ReceiverProof over this message encoded with an empty proof.
  std::string proof;
};
struct Challenge {
  std::string nonce;  // the receiver's, kAuthNonceBytes
};
struct Auth {
  std::string nonce;  // the sender's, kAuthNonceBytes; empty with no secret
  std::string proof;  // SenderProof; empty with no secret
};
struct Begin {
  uint64_t transfer_id = 0;
  uint32_t attempt = 0;
  uint64_t incarnation = 0;
  int64_t deadline_ms = -1;  // time left when sent; < 0: none
  std::vector<int32_t> dst_blocks;
  std::string proof;  // BeginProof of the transfer's key (auth.h); empty: the sender has none
};
struct DataMeta {
  uint64_t transfer_id = 0;
  uint32_t attempt = 0;
  uint32_t layer = 0;
  uint64_t payload_len = 0;
  std::vector<int32_t> blocks;  // destination block ids, in payload order
};
struct Finish {
  uint64_t transfer_id = 0;
  uint32_t attempt = 0;
  uint64_t frames = 0;  // DATA messages of the attempt, counting any lost on the way
  uint64_t bytes = 0;   // their payload bytes
  std::string trailer;
};
// ABORT, RESULT and REFUSE (ids unused).
struct Outcome {
  uint64_t transfer_id = 0;
  uint32_t attempt = 0;
  absl::Status status;
};

std::string EncodeHello(const Hello& m);
std::string EncodeWelcome(const Welcome& m);
std::string EncodeChallenge(const Challenge& m);
std::string EncodeAuth(const Auth& m);
std::string EncodeBegin(const Begin& m);
std::string EncodeDataMeta(const DataMeta& m);
std::string EncodeFinish(const Finish& m);
std::string EncodeOutcome(const Outcome& m);

absl::Status DecodeHello(absl::string_view meta, Hello* m);
absl::Status DecodeWelcome(absl::string_view meta, Welcome* m);
absl::Status DecodeChallenge(absl::string_view meta, Challenge* m);
absl::Status DecodeAuth(absl::string_view meta, Auth* m);
absl::Status DecodeBegin(absl::string_view meta, Begin* m);
absl::Status DecodeDataMeta(absl::string_view meta, DataMeta* m);
absl::Status DecodeFinish(absl::string_view meta, Finish* m);
absl::Status DecodeOutcome(absl::string_view meta, Outcome* m);

// Prefix + metadata of a message without payload (or the head of a DATA message).
std::string MakeFrame(FrameType type, uint16_t flags, const std::string& meta);

}  // namespace tandem::kvtransfer::wire
