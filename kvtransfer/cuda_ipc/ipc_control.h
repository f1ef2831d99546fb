#pragma once

// Control messages of the cuda-ipc transport, framed as every device transport's
// (kvtransfer/control_message.h), with bodies of the tcp wire metadata (kvtransfer/tcp/wire.h):
//   request: u8 kind | u64 sender_id | body
//     CONNECT    str sender device id | HELLO metadata
//     BEGIN      BEGIN metadata
//     DATA       DATA metadata (payload_len = regions * region bytes): "may I write these
//                regions of this layer now?", asked before each device copy
//     LANDED     an Outcome: the copy admitted by the last DATA of the attempt completed (OK) or
//                failed
//     FINISH     FINISH metadata
//     ABORT      an Outcome
//     DISCONNECT empty
//   reply: u16 wire::FrameType | body
//     WELCOME    u32 n | WELCOME metadata (n bytes) | the receiver's pool (PoolExport)
//     REFUSE / RESULT  an Outcome

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
enum ControlKind : uint8_t {
  kConnect = 0x41,
  kBegin = 0x42,
  kData = 0x43,
  kLanded = 0x44,
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

std::string EncodeConnect(absl::string_view device, const wire::Hello& hello);
absl::Status DecodeConnect(absl::string_view body, std::string* device, wire::Hello* hello);

std::string WelcomeReply(const wire::Welcome& welcome, const PoolExport& pool);
absl::Status DecodeWelcomeBody(absl::string_view body, wire::Welcome* welcome, PoolExport* pool);

}  // namespace tandem::kvtransfer::cuda_ipc
