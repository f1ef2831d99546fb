#pragma once

// Control messages of the NCCL transport, framed as every device transport's
// (kvtransfer/control_message.h: u8 kind | u64 sender_id | body; reply u16 wire::FrameType |
// body), with bodies of the TCP wire format's metadata (kvtransfer/tcp/wire.h):
//   CONNECT    body = ncclUniqueId (128 bytes) | u32 nccl protocol | HELLO metadata
//   BEGIN      body = BEGIN metadata
//   FINISH     body = FINISH metadata
//   ABORT      body = ABORT metadata (an Outcome)
//   DISCONNECT body = empty
//   reply: WELCOME (u32 n | WELCOME metadata (n bytes) | u32 nccl protocol | u32 max_run_regions),
//          REFUSE or RESULT (an Outcome)
// max_run_regions: how many regions one ncclRecv of the receiver takes at most, 1 when its
// pool's consecutive block ids are not adjacent in memory (then nothing is coalesced); the
// sender merges regions adjacent on both sides into runs of at most that many (communicator.h).
// Protocol 1 sent every region with its own ncclSend; its CONNECT had no protocol field and its
// WELCOME was the bare metadata: either side of protocol 2 refuses a peer of protocol 1 at
// CONNECT, naming the protocol.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kvtransfer/control_message.h"

namespace tandem::kvtransfer::nccl {

inline constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
inline constexpr uint32_t kNcclProtocol = 2;

// ControlRequest::kind.
enum ControlKind : uint8_t {
  kConnect = 1,
  kBegin = 2,
  kFinish = 3,
  kAbort = 4,
  kDisconnect = 5,
};
static_assert(kConnect == kNcclFirstKind && kDisconnect == kNcclLastKind);
inline constexpr ControlKinds kNcclKinds{kNcclFirstKind, kNcclLastKind, kConnect,   kBegin,
                                         kFinish,        kAbort,        kDisconnect};

// CONNECT's body: `unique_id` (padded to kUniqueIdBytes), `protocol` (other than kNcclProtocol
// only in tests), then `hello` (HELLO metadata).
std::string EncodeConnect(absl::string_view unique_id, absl::string_view hello,
                          uint32_t protocol = kNcclProtocol);
// Splits CONNECT's body into the unique id and the HELLO metadata. FAILED_PRECONDITION naming
// the protocol for a sender of another one; DATA_LOSS when malformed.
absl::Status DecodeConnect(absl::string_view body, std::string* unique_id,
                           absl::string_view* hello);

// WELCOME's body (the reply's, after its frame type).
std::string EncodeWelcomeBody(absl::string_view welcome, uint32_t max_run_regions,
                              uint32_t protocol = kNcclProtocol);
// FAILED_PRECONDITION naming the protocol for a receiver of another one; DATA_LOSS when
// malformed or max_run_regions is 0.
absl::Status DecodeWelcomeBody(absl::string_view body, absl::string_view* welcome,
                               uint32_t* max_run_regions);

}  // namespace tandem::kvtransfer::nccl
