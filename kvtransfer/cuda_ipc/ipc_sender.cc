// The cuda-ipc transport's sending side: the control-channel sender shell (control_sender.h)
// over one Peer per receiver endpoint. A Peer holds the receiver's KV pool mapped into this
// process (one mapping per receiver incarnation, closed once the last peer using it stopped), a
// copy stream and a worker thread that runs the queued work in order. BEGIN's answer admitted
// every region of the transfer, so a DATA item (one layer) costs no message: the stream waits on
// the device for the engine's event of the layer, then copies each contiguous run of regions
// with one call, and records the transfer's event; FINISH (or ABORT) goes out from the peer's
// finisher thread once that event completed, so the copies of several transfers and layers are
// in flight at once, a transfer's FINISH never holds up the next one's copies, and the host
// waits only before a transfer's last message. A zero-copy transfer (TransferTarget::zero_copy)
// is written by the caller's engine straight into the mapped pool (Destination): its DATA items
// queue no copy, only the stream's wait for the layer's event, and its ABORT waits for every
// layer's latest event, so FINISH and ABORT still follow the writes.

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

// A transfer with device work queued on the peer's stream and not yet waited for: the read of its
// source regions the sender keeps (SenderCore::StartRead; none for a zero-copy transfer, which
// reads nothing of this side's pool) and the event recorded after its latest work.
struct InFlight {
  std::shared_ptr<SenderTransfer> transfer;
  bool reading = false;   // holds a StartRead
  void* event = nullptr;  // cudaEvent_t
  absl::Status status;    // a copy that could not be queued
};

// The shell's peer with the receiver's pool: its mapping, the copy stream and the transfers
// with copies in flight, used by the worker thread and released once it stopped.
struct Peer : ControlPeer {
  PoolExport pool;
  std::shared_ptr<MappedPool> mapped;
  std::string no_zero_copy;  // why the caller cannot write this pool itself (empty: it can)
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
    const uint64_t region = options().layout.region_bytes();
    if (peer->pool.block_stride != region) {
      peer->no_zero_copy = absl::StrCat("its blocks lie ", peer->pool.block_stride,
                                        " bytes apart, not one region (", region, ")");
    }
    return peer;
  }

  // Zero-copy needs the receiver's blocks one region apart (as the engine's kernels address a
  // pool) and every layer of every block moved (a windowed layer's pages are not the engine's
  // blocks); every destination region inside the mapped pool.
  absl::Status CheckZeroCopy(ControlPeer* link, const TransferTarget& target) override {
    Peer* p = static_cast<Peer*>(link);
    std::string why = p->no_zero_copy;
    if (why.empty() && !target.window_layers.empty()) why = "the transfer has windowed layers";
    const PoolExport& pool = p->pool;
    const uint64_t last_layer = (options().layout.num_layers - 1) * pool.layer_stride;
    for (int32_t b : target.dst_blocks) {
      if (!why.empty()) break;
      if (b < 0 || b >= pool.num_blocks ||
          last_layer + (b + 1) * pool.block_stride > pool.pool_bytes) {
        return absl::InvalidArgumentError(absl::StrCat("block ", b, " outside the peer's pool"));
      }
    }
    if (why.empty()) return absl::OkStatus();
    return absl::UnimplementedError(
        absl::StrCat("cuda-ipc zero-copy to ", target.endpoint, " is not possible: ", why));
  }

  absl::StatusOr<ZeroCopyDestination> Destination(TransferHandle handle) override {
    std::shared_ptr<SenderTransfer> t = core().Find(handle);
    if (t == nullptr || !t->target.zero_copy) {
      return absl::NotFoundError(absl::StrCat("no live zero-copy kv transfer ", handle));
    }
    Peer* p = static_cast<Peer*>(t->link.get());
    std::lock_guard<std::mutex> lock(map_mu_);
    auto it = destinations_.find(handle);
    if (it != destinations_.end()) return it->second.second;
    if (p->mapped == nullptr) return absl::UnavailableError("the peer's pool is unmapped");
    ZeroCopyDestination d;
    d.base = p->mapped->base();
    d.layer_stride = p->pool.layer_stride;
    d.block_stride = p->pool.block_stride;
    d.blocks = t->target.dst_blocks;
    if (faults().Chance(options().faults.kv_misplace)) {  // fault injection: one block off
      for (int32_t& b : d.blocks) b = static_cast<int32_t>((b + 1) % p->pool.num_blocks);
    }
    d.mapping = p->mapped;
    destinations_.emplace(handle, std::make_pair(p, d));
    return d;
  }

  void StartWorker(ControlPeer* p) override { cudaSetDevice(options().cuda_device); }

  // The transfer's entry of device work in flight, made on first use (nullptr: the transfer
  // ended before it read anything). Only the worker thread adds to or changes an entry before
  // its FINISH or ABORT was handed over (then SettleReads takes it): the entry is used unlocked
  // (unordered_map references stay valid across other insertions and erasures).
  absl::StatusOr<InFlight*> Track(Peer* p, const std::shared_ptr<SenderTransfer>& t) {
    std::lock_guard<std::mutex> flight(p->flight_mu);
    InFlight& f = p->in_flight[t.get()];
    if (f.transfer != nullptr) return &f;
    // The source regions stay read until the copies completed: done waits for SettleReads.
    // A zero-copy transfer reads none.
    if (!t->target.zero_copy) {
      if (!core().StartRead(t)) {
        p->in_flight.erase(t.get());
        return nullptr;
      }
      f.reading = true;
    }
    if (!p->spare_events.empty()) {
      f.event = p->spare_events.back();
      p->spare_events.pop_back();
    } else {
      absl::StatusOr<void*> event = CreateEvent(options().cuda_device);
      if (!event.ok()) {
        if (f.reading) core().EndRead(t);
        p->in_flight.erase(t.get());
        return event.status();
      }
      f.event = *event;
    }
    f.transfer = t;
    return &f;
  }

  // One DATA item, admitted at BEGIN: its copies queued behind the layer's event, one per run
  // of regions contiguous on both sides (a zero-copy transfer's: none, the engine wrote them).
  // Nothing waits here; SettleReads does, before FINISH or ABORT. A failure returned here breaks
  // the peer (the stream is unusable).
  absl::Status SendData(ControlPeer* link, SenderWork& work) override {
    Peer* p = static_cast<Peer*>(link);
    const std::shared_ptr<SenderTransfer>& t = work.transfer;
    const size_t region = options().layout.region_bytes();
    absl::StatusOr<InFlight*> tracked = Track(p, t);
    if (!tracked.ok()) return tracked.status();
    if (*tracked == nullptr) return absl::OkStatus();
    InFlight& f = **tracked;
    absl::Status s = f.status;
    // The layer's KV is final once the engine's event for it fired: the stream waits on the
    // device, the host never does.
    void* ready = access()->LayerReadyEvent(work.layer);
    if (s.ok() && ready != nullptr) s = p->stream->WaitEvent(ready);
    if (!t->target.zero_copy) s = Copy(p, work, s);
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

  // Queues the copies of one DATA item (after `s`, the status so far).
  absl::Status Copy(Peer* p, const SenderWork& work, absl::Status s) {
    const std::shared_ptr<SenderTransfer>& t = work.transfer;
    const size_t region = options().layout.region_bytes();
    const bool misplace = faults().Chance(options().faults.kv_misplace);
    const PoolExport& pool = p->pool;
    const int32_t* dst = t->target.dst_blocks.data() + work.first;
    const int32_t* src = t->src_blocks.data() + work.first;
    for (size_t i = 0; s.ok() && i < work.count;) {
      int64_t block = dst[i];
      if (misplace) block = (block + 1) % pool.num_blocks;  // fault injection: one block off
      const uint64_t offset = work.layer * pool.layer_stride + block * pool.block_stride;
      if (block < 0 || offset + region > pool.pool_bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("block ", block, " outside the peer's pool"));
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
    return s;
  }

  // A zero-copy transfer's ABORT: the caller's engine may have written the blocks up to now, so
  // the message waits for every layer's latest event (recorded after whatever the engine
  // enqueued so far). Its FINISH follows its DATA items, which waited for their layers already.
  void BeforeFinishing(ControlPeer* link, SenderWork& work) override {
    const std::shared_ptr<SenderTransfer>& t = work.transfer;
    if (work.kind != SenderWork::Kind::kAbort || !t->target.zero_copy) return;
    Peer* p = static_cast<Peer*>(link);
    absl::StatusOr<InFlight*> tracked = Track(p, t);
    if (!tracked.ok() || *tracked == nullptr) return;  // ABORT goes out at once: best effort
    InFlight& f = **tracked;
    absl::Status s = f.status;
    for (int64_t l = 0; s.ok() && l < options().layout.num_layers; ++l) {
      if (void* ready = access()->LayerReadyEvent(l)) s = p->stream->WaitEvent(ready);
    }
    if (s.ok()) s = p->stream->Record(f.event);
    f.status = s;
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
    ForgetDestination(t->handle);
    absl::Status waited = WaitEvent(f.event, absl::Now() + options().io_timeout, &p->stop);
    if (waited.ok()) {
      std::lock_guard<std::mutex> flight(p->flight_mu);
      p->spare_events.push_back(f.event);
    } else {
      DestroyEvent(options().cuda_device, f.event);
    }
    if (f.reading) core().EndRead(f.transfer);
    return f.status.ok() ? waited : f.status;
  }

  // Peers replaced or broken close their mappings once nothing uses them; the copies still
  // queued complete first (at most io_timeout each), so done never runs while they read.
  void Release(ControlPeer* link) override {
    Peer* p = static_cast<Peer*>(link);
    for (auto& [raw, f] : p->in_flight) {
      WaitEvent(f.event, absl::Now() + options().io_timeout, nullptr).IgnoreError();
      DestroyEvent(options().cuda_device, f.event);
      if (f.reading) core().EndRead(f.transfer);
    }
    p->in_flight.clear();
    for (void* e : p->spare_events) DestroyEvent(options().cuda_device, e);
    p->spare_events.clear();
    p->stream.reset();
    std::lock_guard<std::mutex> lock(map_mu_);
    for (auto it = destinations_.begin(); it != destinations_.end();) {
      it = it->second.first == p ? destinations_.erase(it) : std::next(it);
    }
    // The last peer of an incarnation closes its mapping, unless a caller still holds a
    // zero-copy destination in it (ZeroCopyDestination::mapping).
    p->mapped.reset();
  }

  void ForgetDestination(TransferHandle handle) {
    std::lock_guard<std::mutex> lock(map_mu_);
    destinations_.erase(handle);
  }

  const std::string device_id_;
  std::mutex map_mu_;
  std::map<std::pair<std::string, uint64_t>, std::weak_ptr<MappedPool>> mappings_;
  // Under map_mu_: the zero-copy destinations handed out (Destination), by handle, with their
  // peer, until the transfer's FINISH or ABORT (SettleReads) or its peer's release.
  std::unordered_map<TransferHandle, std::pair<Peer*, ZeroCopyDestination>> destinations_;
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
