// The cuda-ipc transport's sending side: the control-channel sender shell (control_sender.h)
// over one Peer per receiver endpoint. A Peer holds the receiver's KV pool mapped into this
// process (one mapping per receiver incarnation, closed once the last peer using it stopped), a
// copy stream and a worker thread that runs the queued work in order. BEGIN's answer admitted
// every region of the transfer, so a DATA item (one layer) costs no message: the stream waits on
// the device for the engine's event of the layer, then copies each contiguous run of regions
// with one call, and records the transfer's event; FINISH (or ABORT) goes out from the peer's
// finisher thread once that event completed, so the copies of several transfers and layers are
// in flight at once, a transfer's FINISH never holds up the next one's copies, and the host
// waits only before a transfer's last message.

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cluster/kv_transfer_layout.h"
#include "common/cuda/cuda_api.h"
#include "kvtransfer/control_sender.h"
#include "kvtransfer/cuda_ipc/cuda_ipc_transport.h"
#include "kvtransfer/cuda_ipc/device.h"
#include "kvtransfer/cuda_ipc/ipc_control.h"
#include "kvtransfer/sender_core.h"

namespace tandem::kvtransfer::cuda_ipc {
namespace {

// Regions of one DATA item.
constexpr size_t kMaxBlocksPerMessage = 4096;

// A transfer with copies queued on the peer's stream and not yet waited for: the read of its
// source regions the sender keeps (SenderCore::StartRead) and the event recorded after its
// latest copy.
struct InFlight {
  std::shared_ptr<SenderTransfer> transfer;
  void* event = nullptr;  // cudaEvent_t
  absl::Status status;    // a copy that could not be queued
};

// The shell's peer with the receiver's pool: its mapping, the copy stream and the transfers
// with copies in flight, used by the worker thread and released once it stopped.
struct Peer : ControlPeer {
  PoolExport pool;
  std::shared_ptr<MappedPool> mapped;
  std::unique_ptr<CopyStream> stream;
  // The worker adds copies (SendData), the finisher settles them (SettleReads).
  std::mutex flight_mu;
  std::unordered_map<const SenderTransfer*, InFlight> in_flight;
  std::vector<void*> spare_events;  // completed, for reuse
};

class IpcSender : public ControlSender {
 public:
  IpcSender(const SenderOptions& options, KvRegionAccess* access, std::string device_id)
      : ControlSender(options, access,
                      {"cuda-ipc", "kvt-ipc-send", kIpcKinds, kMaxBlocksPerMessage}),
        device_id_(std::move(device_id)) {}

  ~IpcSender() override { Close(); }

 private:
  // The receiver's pool mapped for `incarnation`: shared by the peers of that incarnation, so
  // a reconnect to the same process never maps it twice; a new incarnation maps anew and the
  // old mapping closes with its last peer.
  absl::StatusOr<std::shared_ptr<MappedPool>> Map(const std::string& endpoint, uint64_t incarnation,
                                                  const PoolExport& pool) {
    std::lock_guard<std::mutex> lock(map_mu_);
    for (auto it = mappings_.begin(); it != mappings_.end();) {
      it = it->second.expired() ? mappings_.erase(it) : std::next(it);
    }
    auto& slot = mappings_[{endpoint, incarnation}];
    if (auto m = slot.lock()) return m;
    absl::StatusOr<std::unique_ptr<MappedPool>> m =
        MappedPool::Open(options().cuda_device, pool.handle, pool.pool_bytes);
    if (!m.ok()) return m.status();
    std::shared_ptr<MappedPool> shared = *std::move(m);
    slot = shared;
    return shared;
  }

  absl::StatusOr<std::shared_ptr<ControlPeer>> Connect(const TransferTarget& target) override {
    wire::Hello hello;
    hello.layout = options().layout;
    ControlReply reply;
    absl::Status s = Handshake(target.endpoint, EncodeConnect(device_id_, hello), &reply);
    if (!s.ok()) return s;
    auto peer = std::make_shared<Peer>();
    wire::Welcome welcome;
    s = DecodeWelcomeBody(reply.body, &welcome, &peer->pool);
    if (!s.ok()) return s;
    s = CheckKvLayoutCompatible(options().layout, welcome.layout);
    if (s.ok() && peer->pool.device != device_id_) {
      s = absl::FailedPreconditionError(
          absl::StrCat("kv transfer peer ", target.endpoint, " is on GPU ", peer->pool.device,
                       ", this sender on ", device_id_, ": cuda-ipc needs both on one GPU"));
    }
    if (s.ok() && peer->pool.process == ProcessToken()) {
      s = absl::FailedPreconditionError(
          absl::StrCat("kv transfer peer ", target.endpoint,
                       " is this process: cuda-ipc moves KV between processes"));
    }
    if (!s.ok()) {
      core().counters().handshakes_refused.fetch_add(1, std::memory_order_relaxed);
      return absl::FailedPreconditionError(s.message());
    }
    peer->endpoint = target.endpoint;
    peer->incarnation = welcome.incarnation;
    if (peer->incarnation != target.incarnation) {
      // The blocks were reserved by an earlier life of the receiver: nothing is mapped for it.
      return IncarnationMismatch(target.endpoint, peer->incarnation, target.incarnation);
    }
    absl::StatusOr<std::shared_ptr<MappedPool>> mapped =
        Map(target.endpoint, welcome.incarnation, peer->pool);
    if (!mapped.ok()) return mapped.status();
    peer->mapped = *std::move(mapped);
    absl::StatusOr<std::unique_ptr<CopyStream>> stream = CopyStream::Create(options().cuda_device);
    if (!stream.ok()) return stream.status();
    peer->stream = *std::move(stream);
    return peer;
  }

  void StartWorker(ControlPeer* p) override { cudaSetDevice(options().cuda_device); }

  // One DATA item, admitted at BEGIN: its copies queued behind the layer's event, one per run
  // of regions contiguous on both sides. Nothing waits here; SettleReads does, before FINISH or
  // ABORT. A failure returned here breaks the peer (the stream is unusable).
  absl::Status SendData(ControlPeer* link, SenderWork& work) override {
    Peer* p = static_cast<Peer*>(link);
    const std::shared_ptr<SenderTransfer>& t = work.transfer;
    const size_t region = options().layout.region_bytes();
    std::unique_lock<std::mutex> flight(p->flight_mu);
    InFlight* fp = &p->in_flight[t.get()];
    if (fp->transfer == nullptr) {
      // The source regions stay read until the copies completed: done waits for SettleReads.
      if (!core().StartRead(t)) {
        p->in_flight.erase(t.get());
        return absl::OkStatus();
      }
      fp->transfer = t;
      if (!p->spare_events.empty()) {
        fp->event = p->spare_events.back();
        p->spare_events.pop_back();
      } else {
        absl::StatusOr<void*> event = CreateEvent(options().cuda_device);
        if (!event.ok()) {
          core().EndRead(t);
          p->in_flight.erase(t.get());
          return event.status();
        }
        fp->event = *event;
      }
    }
    // Only this thread adds to or changes an entry before its FINISH or ABORT was handed over
    // (then SettleReads takes it): the entry is used unlocked (unordered_map references stay
    // valid across other insertions and erasures).
    InFlight& f = *fp;
    flight.unlock();
    absl::Status s = f.status;
    // The layer's KV is final once the engine's event for it fired: the stream waits on the
    // device, the host never does.
    void* ready = access()->LayerReadyEvent(work.layer);
    if (s.ok() && ready != nullptr) s = p->stream->WaitEvent(ready);
    const bool misplace = faults().Chance(options().faults.kv_misplace);
    const PoolExport& pool = p->pool;
    const int32_t* dst = t->target.dst_blocks.data() + work.first;
    const int32_t* src = t->src_blocks.data() + work.first;
    for (size_t i = 0; s.ok() && i < work.count;) {
      int64_t block = dst[i];
      if (misplace) block = (block + 1) % pool.num_blocks;  // fault injection: one block off
      const uint64_t offset = work.layer * pool.layer_stride + block * pool.block_stride;
      if (block < 0 || offset + region > pool.pool_bytes) {
        s = absl::InvalidArgumentError(absl::StrCat("block ", block, " outside the peer's pool"));
        break;
      }
      uint8_t* from = access()->Region(work.layer, src[i]);
      // Coalesce: the next blocks follow on both sides (the receiver's blocks of a layer are
      // adjacent when its block stride is one region).
      size_t n = 1;
      while (!misplace && pool.block_stride == region && i + n < work.count &&
             dst[i + n] == dst[i] + static_cast<int32_t>(n) &&
             offset + (n + 1) * region <= pool.pool_bytes &&
             access()->Region(work.layer, src[i + n]) == from + n * region) {
        ++n;
      }
      s = p->stream->Copy(p->mapped->base() + offset, from, n * region);
      core().counters().device_copies.fetch_add(1, std::memory_order_relaxed);
      i += n;
    }
    if (s.ok()) s = p->stream->Record(f.event);
    t->frames_sent += 1;
    t->bytes_sent += work.count * region;
    if (s.ok()) {
      core().counters().frames.fetch_add(1, std::memory_order_relaxed);
      core().counters().bytes.fetch_add(work.count * region, std::memory_order_relaxed);
      return absl::OkStatus();
    }
    f.status = s;  // the transfer fails at its FINISH (ABORT follows)
    return absl::IsInternal(s) ? s : absl::OkStatus();
  }

  // Waits (at most io_timeout) for the transfer's copies queued so far and ends the read it kept.
  absl::Status SettleReads(ControlPeer* link, const std::shared_ptr<SenderTransfer>& t) override {
    Peer* p = static_cast<Peer*>(link);
    InFlight f;
    {
      std::lock_guard<std::mutex> flight(p->flight_mu);
      auto it = p->in_flight.find(t.get());
      if (it == p->in_flight.end()) return absl::OkStatus();
      f = std::move(it->second);
      p->in_flight.erase(it);
    }
    absl::Status waited = WaitEvent(f.event, absl::Now() + options().io_timeout, &p->stop);
    if (waited.ok()) {
      std::lock_guard<std::mutex> flight(p->flight_mu);
      p->spare_events.push_back(f.event);
    } else {
      DestroyEvent(options().cuda_device, f.event);
    }
    core().EndRead(f.transfer);
    return f.status.ok() ? waited : f.status;
  }

  // Peers replaced or broken close their mappings once nothing uses them; the copies still
  // queued complete first (at most io_timeout each), so done never runs while they read.
  void Release(ControlPeer* link) override {
    Peer* p = static_cast<Peer*>(link);
    for (auto& [raw, f] : p->in_flight) {
      WaitEvent(f.event, absl::Now() + options().io_timeout, nullptr).IgnoreError();
      DestroyEvent(options().cuda_device, f.event);
      core().EndRead(f.transfer);
    }
    p->in_flight.clear();
    for (void* e : p->spare_events) DestroyEvent(options().cuda_device, e);
    p->spare_events.clear();
    p->stream.reset();
    std::lock_guard<std::mutex> lock(map_mu_);
    p->mapped.reset();  // the last peer of an incarnation closes its mapping
  }

  const std::string device_id_;
  std::mutex map_mu_;
  std::map<std::pair<std::string, uint64_t>, std::weak_ptr<MappedPool>> mappings_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvSender>> CreateSender(const SenderOptions& options,
                                                       KvRegionAccess* access) {
  absl::Status s = SenderCore::CheckOptions(options, access);
  if (!s.ok()) return s;
  if (!options.control_channel) {
    return absl::InvalidArgumentError("cuda-ipc kv transport needs SenderOptions.control_channel");
  }
  s = CheckDevice(options.cuda_device);
  if (!s.ok()) return s;
  absl::StatusOr<std::string> device = DeviceId(options.cuda_device);
  if (!device.ok()) return device.status();
  return std::unique_ptr<KvSender>(new IpcSender(options, access, *std::move(device)));
}

}  // namespace tandem::kvtransfer::cuda_ipc
