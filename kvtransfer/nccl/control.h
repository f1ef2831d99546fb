#pragma once

// Control messages of the NCCL transport, framed as every device transport's
// (kvtransfer/control_message.h: u8 kind | u64 sender_id | body; reply u16 wire::FrameType |
// body), with bodies of the TCP wire format's metadata (kvtransfer/tcp/wire.h):
//   CONNECT    body = ncclUniqueId (128 bytes) | HELLO metadata
//   BEGIN      body = BEGIN metadata
//   FINISH     body = FINISH metadata
//   ABORT      body = ABORT metadata (an Outcome)
//   DISCONNECT body = empty
//   reply: WELCOME (WELCOME metadata), REFUSE or RESULT (an Outcome)

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kvtransfer/control_message.h"

namespace tandem::kvtransfer::nccl {

inline constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES

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

// CONNECT's body: `unique_id` (padded to kUniqueIdBytes) then `hello` (HELLO metadata).
std::string EncodeConnect(absl::string_view unique_id, absl::string_view hello);
// Splits CONNECT's body into the unique id and the HELLO metadata.
absl::Status DecodeConnect(absl::string_view body, std::string* unique_id,
                           absl::string_view* hello);

}  // namespace tandem::kvtransfer::nccl
