#pragma once

// The framing of the control messages of the device transports (nccl, cuda-ipc), carried by the
// caller's ControlChannel (the worker's KvControl gRPC service) from a sender to
// KvReceiver::HandleControl, and of their replies. Bodies reuse the tcp wire metadata
// (kvtransfer/tcp/wire.h); each transport defines its kinds and bodies (nccl/control.h,
// cuda_ipc/ipc_control.h):
//   request: u8 kind | u64 sender_id | kind-specific body
//   reply:   u16 wire::FrameType (WELCOME, REFUSE or RESULT) | its body
// One KvControl service serves whichever transport the worker runs; the transports' kinds do
// not overlap (nccl 1..5, cuda-ipc 0x41..0x47), so a receiver refuses the other's requests.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kvtransfer/tcp/wire.h"

namespace tandem::kvtransfer {

// The request kinds of each transport (nccl/control.h, cuda_ipc/ipc_control.h check theirs).
inline constexpr uint8_t kNcclFirstKind = 1;
inline constexpr uint8_t kNcclLastKind = 5;
inline constexpr uint8_t kCudaIpcFirstKind = 0x41;
inline constexpr uint8_t kCudaIpcLastKind = 0x47;
// The transport ("nccl", "cuda-ipc") whose kind an encoded request carries; empty for none.
absl::string_view ControlTransportOf(absl::string_view request);

// One device transport's request kinds: its range, and the messages both have (a transport may
// add its own inside the range).
struct ControlKinds {
  uint8_t first = 0;
  uint8_t last = 0;
  uint8_t connect = 0;
  uint8_t begin = 0;
  uint8_t finish = 0;
  uint8_t abort = 0;
  uint8_t disconnect = 0;
};

struct ControlRequest {
  uint8_t kind = 0;
  uint64_t sender_id = 0;
  std::string body;
};

// What a BEGIN's proof of the transfer key is bound to on these transports (BeginProof's
// binding, auth.h): the sender's id, which every request carries and the receiver keys its
// peers by (random per sender, from the CSPRNG).
std::string ControlBinding(uint64_t sender_id);
// A fresh random sender id (never 0).
uint64_t NewSenderId();

std::string EncodeRequest(const ControlRequest& r);
// DATA_LOSS when `bytes` is too short or its kind is outside [first_kind, last_kind]; the
// messages name the transport as `what` ("kv", "cuda-ipc").
absl::Status DecodeRequest(absl::string_view bytes, uint8_t first_kind, uint8_t last_kind,
                           absl::string_view what, ControlRequest* r);

struct ControlReply {
  wire::FrameType type = wire::FrameType::kResult;
  std::string body;
};

std::string EncodeReply(const ControlReply& r);
absl::Status DecodeReply(absl::string_view bytes, ControlReply* r);

// A RESULT reply carrying `status`.
std::string ResultReply(uint64_t transfer_id, uint32_t attempt, const absl::Status& status);
// A REFUSE reply carrying `status` (a refused handshake).
std::string RefuseReply(const absl::Status& status);
// The status of a RESULT or REFUSE reply (DATA_LOSS when malformed).
absl::Status ReplyStatus(const ControlReply& r);

}  // namespace tandem::kvtransfer
