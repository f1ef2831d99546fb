#pragma once

// Control messages of the cuda-ipc transport (protocol 2), framed as every device transport's
// (kvtransfer/control_message.h), with bodies of the tcp wire metadata (kvtransfer/tcp/wire.h):
//   request: u8 kind | u64 sender_id | body
//     CONNECT    str sender device id | u32 cuda-ipc protocol | HELLO metadata
//     BEGIN      BEGIN metadata; an OK answer admits the copies of every (layer, block) of the
//                attempt (a windowed layer: its window's blocks)
//     FINISH     FINISH metadata: the sender's copies of the attempt landed (its counts: DATA
//                items and bytes copied); answered with the receiver's verdict
//     ABORT      an Outcome: the sender gave up, and its copies of the attempt are over
//     DISCONNECT empty
//   reply: u16 wire::FrameType | body
//     WELCOME    u32 n | WELCOME metadata (n bytes) | the receiver's pool (PoolExport)
//                | u32 cuda-ipc protocol
//     REFUSE / RESULT  an Outcome
// Protocol 1 admitted each layer's copy with a DATA request and reported it with LANDED (kinds
// 0x43, 0x44, now refused); its CONNECT had no protocol field, and its WELCOME none: either side
// of protocol 2 refuses a peer of protocol 1 at CONNECT, naming the protocol.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kvtransfer/control_message.h"
#include "kvtransfer/tcp/wire.h"

namespace tandem::kvtransfer::cuda_ipc {

inline constexpr size_t kIpcHandleBytes = 64;  // CUDA_IPC_HANDLE_SIZE

// ControlRequest::kind. Kinds start at 0x41 so that one KvControl service can tell them from
// nccl's (1..5).
inline constexpr uint32_t kIpcProtocol = 2;

enum ControlKind : uint8_t {
  kConnect = 0x41,
  kBegin = 0x42,
  kDataV1 = 0x43,    // protocol 1 only: refused
  kLandedV1 = 0x44,  // protocol 1 only: refused
  kFinish = 0x45,
  kAbort = 0x46,
  kDisconnect = 0x47,
};
static_assert(kConnect == kCudaIpcFirstKind && kDisconnect == kCudaIpcLastKind);

inline constexpr ControlKinds kIpcKinds{kCudaIpcFirstKind, kCudaIpcLastKind, kConnect,   kBegin,
                                        kFinish,           kAbort,           kDisconnect};

// The receiver's KV pool as the sender maps it: one exported allocation whose region (layer,
// block) starts at layer * layer_stride + block * block_stride bytes from its base.
struct PoolExport {
  std::string handle;  // cudaIpcMemHandle_t, kIpcHandleBytes
  uint64_t pool_bytes = 0;
  int64_t num_blocks = 0;
  uint64_t layer_stride = 0;
  uint64_t block_stride = 0;
  uint64_t process = 0;  // random per receiver process: the sender never maps its own process
  std::string device;    // the receiver's GPU (DeviceId)
};

// CONNECT of protocol kIpcProtocol (`protocol` other than that only in tests).
std::string EncodeConnect(absl::string_view device, const wire::Hello& hello,
                          uint32_t protocol = kIpcProtocol);
// FAILED_PRECONDITION naming the protocol for a sender of another one; DATA_LOSS when malformed.
absl::Status DecodeConnect(absl::string_view body, std::string* device, wire::Hello* hello);

std::string WelcomeReply(const wire::Welcome& welcome, const PoolExport& pool);
// FAILED_PRECONDITION naming the protocol for a receiver of another one.
absl::Status DecodeWelcomeBody(absl::string_view body, wire::Welcome* welcome, PoolExport* pool);

}  // namespace tandem::kvtransfer::cuda_ipc
