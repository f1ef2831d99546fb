#pragma once

// Which KV transport a prefill worker (sender) and a decode worker (receiver) use, decided from
// what each advertises (WorkerInfo.kv_transport, kv_device): the router's registration check and
// its choice per transfer (PrefillRequest.target.kv_transport) both come from here, so they
// agree. The router links no kvtransfer code, hence this module (common/cluster).
//
// A worker speaks one transport ("tcp", "nccl", "cuda-ipc") or, with `--kv-transport auto` on a
// GPU, several ("nccl,cuda-ipc": kvtransfer/multi). Rules for a pair:
//   cuda-ipc  both speak it and both are on one physical GPU (same kv_device);
//   nccl      both speak it and they are on different GPUs (NCCL refuses two ranks on one GPU);
//   tcp       both speak it (host memory).
// The first that applies, in that order, is the pair's transport.

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

// The transports a worker advertising `kv_transport` speaks ("a,b" lists several; empty: tcp).
std::vector<std::string> SpokenKvTransports(std::string_view kv_transport);

// One side of a pair, as the router knows it.
struct KvTransportPeer {
  std::string role;          // "prefill", "decode" or "both"
  std::string address;       // for messages
  std::string kv_transport;  // WorkerInfo.kv_transport
  std::string kv_device;     // WorkerInfo.kv_device ("GPU-<uuid>"; empty: no GPU)
};

// The transport `sender` uses to send KV to `receiver`, or FAILED_PRECONDITION naming both
// sides, what each speaks and why no transport applies.
absl::StatusOr<std::string> PairKvTransport(const KvTransportPeer& sender,
                                            const KvTransportPeer& receiver);

}  // namespace tandem
