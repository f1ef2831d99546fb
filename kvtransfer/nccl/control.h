#pragma once

// Control messages of the NCCL transport, carried by the caller's ControlChannel (the worker's
// gRPC control service) from a sender to KvReceiver::HandleControl, and the replies. They reuse
// the TCP wire format's metadata encodings (kvtransfer/tcp/wire.h):
//   request: u8 kind | u64 sender_id | kind-specific body
//     CONNECT    body = ncclUniqueId (128 bytes) | HELLO metadata
//     BEGIN      body = BEGIN metadata
//     FINISH     body = FINISH metadata
//     ABORT      body = ABORT metadata (an Outcome)
//     DISCONNECT body = empty
//   reply:   u16 wire::FrameType (WELCOME, REFUSE or RESULT) | its metadata

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kvtransfer/tcp/wire.h"

namespace tandem::kvtransfer::nccl {

inline constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES

enum class ControlKind : uint8_t {
  kConnect = 1,
  kBegin = 2,
  kFinish = 3,
  kAbort = 4,
  kDisconnect = 5,
};

struct ControlRequest {
  ControlKind kind = ControlKind::kConnect;
  uint64_t sender_id = 0;
  std::string unique_id;  // CONNECT
  std::string body;       // wire metadata of the kind
};

std::string EncodeRequest(const ControlRequest& r);
absl::Status DecodeRequest(absl::string_view bytes, ControlRequest* r);

struct ControlReply {
  wire::FrameType type = wire::FrameType::kResult;
  std::string body;
};

std::string EncodeReply(const ControlReply& r);
absl::Status DecodeReply(absl::string_view bytes, ControlReply* r);

// A RESULT reply carrying `status`.
std::string ResultReply(uint64_t transfer_id, uint32_t attempt, const absl::Status& status);
// The status of a RESULT or REFUSE reply (DATA_LOSS when malformed).
absl::Status ReplyStatus(const ControlReply& r);

}  // namespace tandem::kvtransfer::nccl
