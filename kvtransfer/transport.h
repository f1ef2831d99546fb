#pragma once

// KV-cache transfer between workers (DESIGN §5). A prefill worker (sender) pushes regions of
// its KV pool -- one region is one (layer, block) pair, laid out as the backends define it --
// into blocks a decode worker (receiver) reserved for the request. Implementations: "tcp"
// (host memory, zero-copy scatter/gather, checksum per message), "loopback" (in-process, for
// tests), "nccl" (device memory between GPUs; built with CUDA and NCCL) and "cuda-ipc" (device
// memory between two processes on one GPU; built with CUDA). A worker may speak several device
// transports at once ("nccl,cuda-ipc", multi_transport.h); each transfer then runs on the one
// its target names.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/dtype.h"
#include "common/cluster/kv_transfer_layout.h"
#include "kvtransfer/faults.h"
#include "kvtransfer/transfer_hooks.h"

namespace tandem::kvtransfer {

// What both sides must agree on before any byte moves (common/cluster/kv_transfer_layout.h, where
// the router's registration check finds it too). Exchanged at connect time; a mismatch refuses
// the connection with CheckKvLayoutCompatible's message naming the field.
using ::tandem::KvLayout;

// Access to the KV pool's bytes. For host memory (the CPU backend) Region returns a pointer the
// transport reads from / writes into directly (zero copy). Regions of blocks taking part in a
// transfer are stable: the sender's blocks are held and the receiver's are reserved and unused
// until the transfer completes. For nccl, Region returns device pointers. Region is called from
// transport threads concurrently with the engine thread, so it must be a pure address
// computation (as the CPU backend's HostBlockRegion is).
class KvRegionAccess {
 public:
  virtual ~KvRegionAccess() = default;
  virtual uint8_t* Region(int64_t layer, int32_t block) = 0;
  virtual int64_t num_blocks() const = 0;
  // The device event (a cudaEvent_t) the engine recorded on its stream after it last enqueued
  // writes of `layer`'s KV, or null when the regions are final whenever the transport reads
  // them (host memory, an engine that synchronized). A device transport's copy stream waits for
  // it (cudaStreamWaitEvent: on the device, never the host) before reading the layer. Valid for
  // the access's lifetime; re-recorded by later steps (waiting for a later record is safe).
  virtual void* LayerReadyEvent(int64_t layer) { return nullptr; }
};

// Counters a transport keeps for metrics (DESIGN §7: KV transfer time and bytes). Monotonic
// since creation; read them with stats() and export deltas.
struct TransportStats {
  uint64_t bytes = 0;               // KV payload bytes sent (sender) or accepted (receiver)
  uint64_t frames = 0;              // DATA messages sent / accepted
  uint64_t transfers_started = 0;   // attempts begun
  uint64_t transfers_ok = 0;        // attempts completed and verified
  uint64_t transfers_failed = 0;    // attempts that ended with an error (incl. aborts, deadlines)
  uint64_t checksum_failures = 0;   // DATA messages whose checksum did not match (receiver)
  uint64_t deadline_expired = 0;    // attempts failed by their deadline
  uint64_t connects = 0;            // handshakes completed (sender: outgoing; receiver: accepted)
  uint64_t handshakes_refused = 0;  // layout / protocol mismatches at connect time
  uint64_t connections_lost = 0;    // connections that failed while open
  uint64_t faults_injected = 0;     // fault-injection actions taken (TANDEM_FAULTS)
  // Receiver: connections refused or cut for a limit (ReceiverLimits: connections, memory;
  // the handshake deadline).
  uint64_t connections_refused = 0;
  // Receiver: BEGIN / DATA / FINISH / ABORT refused because their sender was not the one named
  // for the transfer (no proof of its key, another connection's or sender's attempt).
  uint64_t messages_refused = 0;
  // tcp receiver: bytes of connection buffers charged to ReceiverLimits::memory_budget now, and
  // the most ever charged at once.
  uint64_t buffer_bytes = 0;
  uint64_t buffer_bytes_peak = 0;
  // nccl, cuda-ipc: control messages this side sent and received (sender: requests out, replies
  // in; receiver: replies out, requests in), CONNECT and DISCONNECT included.
  uint64_t control_sent = 0;
  uint64_t control_received = 0;
  // Device calls that move KV regions, one per run of regions adjacent on both sides: cuda-ipc
  // sender, copy calls; nccl, ncclSend (sender) / ncclRecv (receiver) calls (headers apart).
  uint64_t device_copies = 0;
  uint64_t transfer_micros_sum = 0;  // Begin -> verified, summed over transfers_ok (sender)
  uint64_t transfer_micros_max = 0;
};

// The channel the NCCL transport uses for its control messages (handshake, communicator
// setup with the ncclUniqueId, per-transfer begin/finish). The worker code carries `request`
// to the decode worker at `endpoint` (e.g. over its gRPC control service), hands it to that
// worker's KvReceiver::HandleControl and returns the reply. Unused by tcp and loopback.
using ControlChannel = std::function<absl::StatusOr<std::string>(const std::string& endpoint,
                                                                 const std::string& request)>;

// ---------------------------------------------------------------- receiver (decode worker)

// What a tcp receiver lets its peers hold (README.md, "Bounds"). A connection over a cap is
// closed at once; one that cannot charge its buffers to the budget is closed (or refused)
// instead of allocating them.
struct ReceiverLimits {
  int max_connections = 128;          // open at once, all peers
  int max_connections_per_peer = 32;  // open at once from one peer address
  // Every connection's buffers: kHandshakeChargeBytes from accept, kConnectionChargeBytes more
  // once authenticated (its message allowance and scratch), and any message's metadata beyond
  // that allowance while it is read. Must cover max_connections authenticated connections.
  int64_t memory_budget = int64_t{96} << 20;
  // The largest message a peer may send before its handshake completed (HELLO, AUTH).
  uint32_t max_handshake_message = 4 << 10;
};
inline constexpr int64_t kHandshakeChargeBytes = 16 << 10;
inline constexpr int64_t kConnectionChargeBytes = (64 << 10) + (256 << 10);

struct ReceiverOptions {
  std::string transport = "tcp";   // tcp | loopback | nccl | cuda-ipc
  std::string host = "127.0.0.1";  // tcp: address to listen on
  int port = 0;                    // tcp: 0 picks a free port
  // tcp: the host part of endpoint(), for senders on other machines. Empty: `host`, or this
  // machine's hostname when `host` is a wildcard ("0.0.0.0", "::", "").
  std::string advertise_host;
  KvLayout layout;
  // loopback / nccl: the endpoint name senders use; empty picks a unique one.
  std::string name;
  // tcp: a connection that makes no progress inside a message for this long is broken.
  absl::Duration io_timeout = absl::Seconds(10);
  // tcp: the whole handshake of a new connection (HELLO, AUTH, the answers) must be done within
  // this long after accept, however its bytes trickle in; else the connection is closed.
  absl::Duration handshake_timeout = absl::Seconds(5);
  // tcp: connection caps and the memory budget.
  ReceiverLimits limits;
  // tcp: the shared secret (ReadSecretFile, kvtransfer/auth.h). Non-empty: every connection
  // must prove it in the handshake (HMAC-SHA256 challenge-response) and this receiver proves
  // it back; senders without it, or with another, are refused. Empty: senders with a secret
  // refuse this receiver. Other transports reject a secret (INVALID_ARGUMENT).
  std::string secret;
  // An attempt whose sender went silent is failed this long after its deadline (the sender
  // normally aborts it at the deadline itself).
  absl::Duration deadline_grace = absl::Seconds(2);
  // The deadline of an attempt whose sender gave none: nothing waits forever.
  absl::Duration max_transfer_time = absl::Minutes(5);
  // Fault injection (faults.h). Off unless enabled here or by TANDEM_FAULTS.
  FaultOptions faults;
  bool faults_from_env = true;
  // nccl, cuda-ipc: CUDA device of the KV pool; nccl: the most communicators kept (each costs
  // memory).
  int cuda_device = 0;
  int max_communicators = 8;
  // nccl, cuda-ipc: the incarnation() to report; 0 picks a random one (a multi-transport
  // receiver gives its transports one).
  uint64_t incarnation = 0;
  // Metrics (direction receive), whatever the transport: one transfer per expectation, from
  // Expect to its completion. May be null; must outlive the receiver.
  TransferHooks* hooks = nullptr;
};

// The outcome of one expected transfer.
struct CompletedTransfer {
  uint64_t transfer_id = 0;
  absl::Status status;   // OK; DATA_LOSS (checksum), ABORTED (sender gave up), ...
  std::string trailer;   // opaque bytes the sender attached to Finish (e.g. first tokens)
  uint32_t attempt = 0;  // the attempt that ended
  // From Expect to this outcome, on the receiver's clock: for a transfer that succeeded, how
  // long the receiver waited for its KV (what a decode worker reports in the TTFT split).
  absl::Duration waited = absl::ZeroDuration();
};

struct Expectation {
  uint64_t transfer_id = 0;
  // Blocks the sender may write, in the order of the sender's block list; every layer of each
  // except the windowed layers below.
  std::vector<int32_t> dst_blocks;
  // Windowed layers (sliding-window layers of a window-layout pool, whose pages exist only for
  // the blocks the next query can see): for these only dst_blocks[window_first, n) are sent.
  // Empty (default): every layer gets every block. transfer_window.h validates and counts.
  std::vector<int64_t> window_layers;
  int32_t window_first = 0;
  // The transfer's key (NewTransferKey, auth.h). Non-empty: an attempt is accepted only from a
  // sender whose BEGIN proves it (TransferTarget::transfer_key); everything else about the
  // transfer is refused without telling whether it exists. Empty: any sender may begin it
  // (tests of the transports; the decode worker always sets one).
  std::string transfer_key;
};

class KvReceiver {
 public:
  using CompletionCallback = std::function<void(const CompletedTransfer&)>;
  virtual ~KvReceiver() = default;

  // "host:port" for tcp, a name for loopback: what senders connect to.
  virtual std::string endpoint() const = 0;
  // Random per process start; senders check it so a restarted receiver is never fed a
  // transfer reserved by its previous life.
  virtual uint64_t incarnation() const = 0;

  // Registers a transfer before the sender starts. Thread-safe. Data for unknown transfers,
  // or for blocks outside dst_blocks, is discarded and the sender told so. Only the sender that
  // began the live attempt (proving transfer_key) may send its DATA, FINISH and ABORT. Expecting
  // an id that is already expected replaces it (like Cancel, then Expect).
  virtual void Expect(const Expectation& expectation) = 0;
  // Runs once a cancelled transfer's blocks are released: no write the transport admitted for it
  // can land any more, so they can be freed.
  using ReleasedCallback = std::function<void()>;
  // Forgets a transfer (request cancelled or lease expired); late data is discarded and the
  // sender told. No on_complete follows a Cancel. Never waits for the transfer's sender or its
  // writes: `released` (may be null) runs exactly once when the transport will never write the
  // transfer's blocks again -- on the calling thread before Cancel returns when nothing of it is
  // in flight, else later on a transport thread (never under a transport lock): tcp and loopback
  // after the syscall / memcpy in flight, nccl after the message in flight (bounded by
  // io_timeout), cuda-ipc once the sender reported its admitted copies over (FINISH, ABORT), its
  // peer went, or the admission ended (the attempt's deadline plus io_timeout). Not after the
  // receiver began its destruction. Thread-safe.
  virtual void Cancel(uint64_t transfer_id, ReleasedCallback released) = 0;
  // Cancel, then waits for `released`: for tests and for callers that may block (never the
  // engine thread).
  void CancelAndWait(uint64_t transfer_id);
  // Transfers expected and not yet completed.
  virtual int64_t num_in_flight() const = 0;

  virtual TransportStats stats() const { return {}; }
  // nccl, cuda-ipc: answers a control message a sender sent through its ControlChannel.
  // Thread-safe; may block while a communicator is set up. Other transports: UNIMPLEMENTED.
  virtual absl::StatusOr<std::string> HandleControl(const std::string& request) {
    return absl::UnimplementedError("this kv transport has no control channel");
  }
};

// `on_complete` runs on a transport thread once per transfer attempt that ends (success or
// failure). After a failure the expectation stays registered, so the router can retry the
// prefill (possibly from another sender) into the same blocks: a new attempt resets it.
absl::StatusOr<std::unique_ptr<KvReceiver>> CreateReceiver(
    const ReceiverOptions& options, KvRegionAccess* access,
    KvReceiver::CompletionCallback on_complete);

// ---------------------------------------------------------------- sender (prefill worker)

struct SenderOptions {
  std::string transport = "tcp";
  KvLayout layout;
  absl::Duration connect_timeout = absl::Seconds(5);
  // The deadline of a transfer whose target has none (InfiniteFuture): nothing waits forever.
  absl::Duration max_transfer_time = absl::Minutes(5);
  // tcp: CRC32C per DATA message (verified by the receiver). Off only for benchmarks.
  bool checksum = true;
  // tcp: a connection that makes no progress inside a message for this long is broken.
  absl::Duration io_timeout = absl::Seconds(10);
  // tcp: a layer is split into DATA messages of at most this many payload bytes, so that
  // transfers sharing a connection interleave.
  size_t max_message_bytes = 4 << 20;
  // tcp: the shared secret, as ReceiverOptions::secret: this sender proves it to every receiver
  // and refuses a receiver that cannot prove it back (or has none). Empty: none.
  std::string secret;
  // Fault injection (faults.h). Off unless enabled here or by TANDEM_FAULTS.
  FaultOptions faults;
  bool faults_from_env = true;
  // nccl, cuda-ipc: control messages to receivers and the CUDA device of the KV pool; nccl: the
  // most communicators kept open at once (least recently used idle ones are destroyed first).
  ControlChannel control_channel;
  int cuda_device = 0;
  int max_communicators = 8;
  // Metrics (direction send), whatever the transport: one transfer per Begin, until its done
  // or Abort. May be null; must outlive the sender.
  TransferHooks* hooks = nullptr;
  // Several transports ("nccl,cuda-ipc"): the hooks of each (so that a transfer is counted under
  // the transport it took); unset: `hooks` for all.
  std::function<TransferHooks*(const std::string& transport)> transport_hooks;
};

struct TransferTarget {
  std::string endpoint;      // the receiver's endpoint()
  uint64_t incarnation = 0;  // the receiver's incarnation() when it reserved the blocks
  uint64_t transfer_id = 0;
  uint32_t attempt = 0;  // increases on each retry of the same transfer
  std::vector<int32_t> dst_blocks;
  absl::Time deadline = absl::InfiniteFuture();
  // As Expectation's: windowed layers send only blocks [window_first, n) of src/dst_blocks.
  // Must equal the receiver's expectation (else the receiver refuses the data or finds it
  // incomplete).
  std::vector<int64_t> window_layers;
  int32_t window_first = 0;
  // The transport to use (chosen per pair by the router, common/cluster/kv_transport_pair.h). Only
  // a sender of several transports needs it; empty: the sender's own.
  std::string transport;
  // This attempt's key, TransferAttemptKey(the reservation's key, attempt) (the router derives
  // it; README "Transfer ids and the sender binding"), proven in BEGIN.
  std::string transfer_key;
  // Zero-copy (README.md, "Zero-copy on one GPU"): the caller's engine writes the KV straight
  // into the receiver's blocks (KvSender::Destination) and the transport copies nothing. Only
  // cuda-ipc, to a peer whose pool it mapped with its blocks one region apart, and without
  // windowed layers; elsewhere Begin refuses it with UNIMPLEMENTED (saying why) before any
  // message of the transfer, and the caller may begin the same attempt again copying.
  bool zero_copy = false;
};

using TransferHandle = uint64_t;

// Where a zero-copy transfer's KV goes: region (layer, i) of the transfer (i indexing src_blocks
// and dst_blocks) lies at base + layer * layer_stride + blocks[i] * block_stride, in the
// receiver's pool mapped into this process, laid out as this side's regions (KvLayout). `blocks`
// are the receiver's block ids (fault injection kv_misplace: one block off). The mapping stays
// open while `mapping` is held: the caller keeps it until its writes completed, even if the
// receiver's peer was replaced meanwhile.
struct ZeroCopyDestination {
  uint8_t* base = nullptr;
  uint64_t layer_stride = 0;
  uint64_t block_stride = 0;
  std::vector<int32_t> blocks;
  std::shared_ptr<const void> mapping;
};

class KvSender {
 public:
  using DoneCallback = std::function<void(absl::Status)>;
  virtual ~KvSender() = default;

  // Starts a transfer of src_blocks[i] -> target.dst_blocks[i] (same count). Connects (and
  // handshakes) to the endpoint if needed, which may block up to connect_timeout. Errors:
  // FAILED_PRECONDITION when the layouts differ (naming the field) or the receiver's
  // incarnation changed; UNAVAILABLE / DEADLINE_EXCEEDED when the endpoint is unreachable;
  // INVALID_ARGUMENT for bad block lists. A receiver that rejects the transfer (unknown id,
  // foreign blocks) fails it asynchronously: done reports it (nccl: Begin already does).
  // Every handle must end with Finish or Abort.
  virtual absl::StatusOr<TransferHandle> Begin(const TransferTarget& target,
                                               std::vector<int32_t> src_blocks) = 0;
  // Queues layer `layer` of every block of the transfer. Never blocks the caller (the engine
  // thread): bytes are read from the regions later by the transport's thread, so the regions
  // must stay untouched until the transfer is done.
  virtual void SendLayer(TransferHandle handle, int64_t layer) = 0;
  // After the last layer: sends `trailer` and calls `done` once the receiver has verified
  // everything (OK), or with the failure (checksum mismatch, deadline, connection lost, ...).
  virtual void Finish(TransferHandle handle, std::string trailer, DoneCallback done) = 0;
  // Gives up; `done` (if Finish was called) runs with ABORTED. The receiver is told. tcp and
  // loopback never read the transfer's regions after Abort returns (nor after done ran, on
  // any outcome); nccl may until the message in flight completes (bounded by io_timeout).
  virtual void Abort(TransferHandle handle) = 0;
  // Handles begun and not yet ended by Finish (outcome delivered) or Abort.
  virtual int64_t num_in_flight() const = 0;

  // The destination of a transfer begun with TransferTarget::zero_copy; NOT_FOUND for a handle
  // that is not one (or has ended). For such a transfer SendLayer(layer) queues no copy: it marks
  // the layer's writes as enqueued (the transport waits, on the device, for the engine's event of
  // the layer before FINISH); Abort tells the receiver once every layer's latest event recorded
  // by then completed, so the caller aborts only once its engine enqueues no more writes of the
  // transfer. Thread-safe.
  virtual absl::StatusOr<ZeroCopyDestination> Destination(TransferHandle handle) {
    return absl::NotFoundError("this kv transport has no zero-copy transfers");
  }

  virtual TransportStats stats() const { return {}; }
};

absl::StatusOr<std::unique_ptr<KvSender>> CreateSender(const SenderOptions& options,
                                                       KvRegionAccess* access);

// ---------------------------------------------------------------- choosing a transport

// Whether this build has the nccl transport (CUDA and NCCL found at configure time, or the
// test-only GPU emulation).
bool NcclBuilt();
// Whether this build has the cuda-ipc transport (CUDA found, or the test-only GPU emulation).
bool CudaIpcBuilt();
// Whether `transport` moves KV in device memory and sends its control messages through
// SenderOptions::control_channel to KvReceiver::HandleControl (nccl, cuda-ipc): the workers run
// the KvControl service for it (kvtransfer/control_rpc).
bool UsesControlChannel(const std::string& transport);
// The physical identity ("GPU-<uuid>") of CUDA device `cuda_device`, which the workers advertise
// (WorkerInfo.kv_device) so that "same GPU" is decidable; empty in a build without CUDA.
std::string GpuId(int cuda_device);

// The transport a worker runs for a --kv-transport value, decided once at startup from the
// engine's device ("cpu" or "cuda:N", engine_builder.h's ResolveDevice), so that a worker that
// cannot run it fails before it serves, with one line saying why:
//   tcp, loopback  as asked, with the engine on the CPU (they move host memory);
//   nccl           needs a build with NCCL, a usable CUDA device, and the engine on it
//                  (--device cuda): the KV moves from device memory;
//   cuda-ipc       needs a build with CUDA, a usable CUDA device and the engine on it; its
//                  receivers refuse, at connect, a sender on another GPU;
//   auto           tcp on the CPU; on a CUDA device every device transport the build has
//                  ("nccl,cuda-ipc", or "cuda-ipc" without NCCL; refused without CUDA): the
//                  router then picks, per pair of workers, cuda-ipc on one GPU and nccl across
//                  GPUs (common/cluster/kv_transport_pair.h). ResolveSharedGpuTransport picks
//                  cuda-ipc alone for a cluster on one GPU.
//   "a,b"          several of nccl and cuda-ipc, each checked as above.
// The router refuses at registration a worker that cannot talk to every worker of the other
// role.
absl::StatusOr<std::string> ResolveTransport(const std::string& requested,
                                             const std::string& device);

// ResolveTransport for a whole cluster whose workers all run their engine on `device` of this
// machine (`tandem serve`): `auto` on a GPU then resolves to cuda-ipc (every worker shares
// that one GPU) when the build has it; everything else as ResolveTransport.
absl::StatusOr<std::string> ResolveSharedGpuTransport(const std::string& requested,
                                                      const std::string& device);

}  // namespace tandem::kvtransfer
