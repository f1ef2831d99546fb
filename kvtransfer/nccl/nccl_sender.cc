// The NCCL transport's sending side: the control-channel sender shell (control_sender.h) over
// one Peer per receiver endpoint, its communicator (rank 0) and its worker thread, which enqueues
// each DATA message on the communicator's stream in queue order behind the layer's event and
// never waits for it; the peer's finisher thread waits for a transfer's messages (its event,
// with a deadline) before its FINISH or ABORT. So SendLayer only enqueues and several
// transfers are in flight per peer. At most max_communicators peers: the least recently used
// idle one is evicted to make room. User callbacks run on the core's event loop.

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cluster/kv_transfer_layout.h"
#include "kvtransfer/control_sender.h"
#include "kvtransfer/crc32c.h"
#include "kvtransfer/cuda_device.h"
#include "kvtransfer/nccl/communicator.h"
#include "kvtransfer/nccl/control.h"
#include "kvtransfer/nccl/nccl_transport.h"
#include "kvtransfer/nccl/sender_peer.h"
#include "kvtransfer/peer_pool.h"
#include "kvtransfer/sender_core.h"

namespace tandem::kvtransfer::nccl {
namespace {

class NcclSender : public ControlSender {
 public:
  NcclSender(const SenderOptions& options, KvRegionAccess* access)
      : ControlSender(options, access,
                      {"nccl", "kvt-nccl-send", kNcclKinds, kMaxBlocksPerMessage}) {}

  ~NcclSender() override { Close(); }

 private:
  absl::StatusOr<PeerMap::iterator> PickEviction(PeerMap& peers) override {
    if (static_cast<int>(peers.size()) < options().max_communicators) return peers.end();
    auto victim = PickVictim(peers);
    if (victim == peers.end()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("all ", options().max_communicators, " nccl communicators are busy"));
    }
    return victim;
  }

  absl::StatusOr<std::shared_ptr<ControlPeer>> Connect(const TransferTarget& target) override {
    absl::StatusOr<std::string> id = NewUniqueId();
    if (!id.ok()) return id.status();
    wire::Hello hello;
    hello.layout = options().layout;
    ControlReply reply;
    absl::Status s =
        Handshake(target.endpoint, EncodeConnect(*id, wire::EncodeHello(hello)), &reply);
    if (!s.ok()) return s;
    wire::Welcome welcome;
    absl::string_view welcome_meta;
    uint32_t max_run_regions = 1;
    s = DecodeWelcomeBody(reply.body, &welcome_meta, &max_run_regions);
    if (s.ok()) s = wire::DecodeWelcome(welcome_meta, &welcome);
    if (s.ok()) s = CheckKvLayoutCompatible(options().layout, welcome.layout);
    if (!s.ok()) return absl::FailedPreconditionError(s.message());
    auto peer = std::make_shared<Peer>();
    peer->max_run_regions = max_run_regions;
    peer->endpoint = target.endpoint;
    peer->incarnation = welcome.incarnation;
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        Communicator::Start(*id, /*rank=*/0, options().cuda_device, 0);
    if (!comm.ok()) return comm.status();
    s = (*comm)->WaitReady(absl::Now() + options().connect_timeout, nullptr);
    if (!s.ok()) return s;
    peer->comm = std::move(*comm);
    return peer;
  }

  void StartWorker(ControlPeer* p) override { cudaSetDevice(Comm(p)->device()); }

  // One DATA message, enqueued on the communicator's stream behind the layer's event: the
  // header, then the regions straight from the KV pool as one group, then the transfer's event.
  // Nothing waits for the data here: the device reads the regions until SettleReads saw the
  // event, so the messages of several layers and transfers are in flight at once. A failure
  // breaks the peer (the communicator was aborted).
  absl::Status SendData(ControlPeer* link, SenderWork& work) override {
    Peer* p = static_cast<Peer*>(link);
    const std::shared_ptr<SenderTransfer>& t = work.transfer;
    Communicator* comm = p->comm.get();
    const size_t region = options().layout.region_bytes();
    std::unique_lock<std::mutex> flight(p->flight_mu);
    InFlight* fp = &p->in_flight[t.get()];
    if (fp->transfer == nullptr) {
      // The source regions stay read until the messages completed: done waits for SettleReads.
      if (!core().StartRead(t)) {
        p->in_flight.erase(t.get());
        return absl::OkStatus();
      }
      fp->transfer = t;
      if (!p->spare_events.empty()) {
        fp->event = p->spare_events.back();
        p->spare_events.pop_back();
      }
    }
    // Only this thread changes an entry before its FINISH or ABORT was handed over (then
    // SettleReads takes it): used unlocked (references into an unordered_map stay valid).
    InFlight& f = *fp;
    flight.unlock();
    if (f.event == nullptr) {
      absl::StatusOr<void*> event = comm->NewEvent();
      if (!event.ok()) return event.status();  // Release ends the read
      f.event = *event;
    }
    absl::StatusOr<HeaderSlot> slot = comm->NewHeaderSlot();
    if (!slot.ok()) return slot.status();
    f.slots.push_back(*slot);
    MessageHeader* h = slot->host;
    std::memset(h, 0, kHeaderBytes);
    h->magic = kHeaderMagic;
    h->count = static_cast<uint32_t>(work.count);
    h->transfer_id = t->target.transfer_id;
    h->attempt = t->target.attempt;
    h->layer = static_cast<uint32_t>(work.layer);
    // Regions adjacent in both pools (the source's addresses follow, the destination's block
    // ids do and its WELCOME said consecutive ids are adjacent) go as one run, one ncclSend.
    std::vector<RegionRun> runs;
    const int32_t* dst = t->target.dst_blocks.data() + work.first;
    const uint8_t* prev = nullptr;
    for (size_t i = 0; i < work.count; ++i) {
      h->blocks[i] = dst[i];
      const uint8_t* src = access()->Region(work.layer, t->src_blocks[work.first + i]);
      if (i > 0 && src == prev + region && dst[i] == dst[i - 1] + 1 &&
          runs.back().bytes < p->max_run_regions * region) {
        SetJoined(h, i);
        runs.back().bytes += region;
      } else {
        runs.push_back({src, region});
      }
      prev = src;
    }
    h->crc = Crc32c(0, h, kHeaderBytes);
    // The layer's KV is final once the engine's event for it fired: the stream waits for it on
    // the device, the host never does.
    absl::Status s = comm->EnqueueMessage(access()->LayerReadyEvent(work.layer), *slot, runs,
                                          f.event, absl::Now() + options().io_timeout);
    t->frames_sent += 1;
    t->bytes_sent += work.count * region;
    if (s.ok()) {
      core().counters().device_copies.fetch_add(runs.size(), std::memory_order_relaxed);
      core().counters().frames.fetch_add(1, std::memory_order_relaxed);
      core().counters().bytes.fetch_add(work.count * region, std::memory_order_relaxed);
    }
    return s;
  }

  // Waits (at most io_timeout) for the transfer's messages enqueued so far, then gives back
  // their header slots and ends the read it kept. A failure aborted the communicator: the peer
  // breaks.
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
    absl::Status waited =
        f.event == nullptr
            ? absl::OkStatus()
            : p->comm->WaitFor(f.event, absl::Now() + options().io_timeout, &p->stop);
    {
      std::lock_guard<std::mutex> flight(p->flight_mu);
      if (waited.ok()) {
        for (HeaderSlot& slot : f.slots) p->comm->FreeHeaderSlot(slot);
        if (f.event != nullptr) p->spare_events.push_back(f.event);
      } else {
        Orphan(p, f);
      }
    }
    core().EndRead(f.transfer);
    // A failure aborted the communicator (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED): the peer
    // breaks.
    return waited;
  }

  void OnBroken(ControlPeer* p) override { static_cast<Peer*>(p)->comm->Abort(); }

  // Both threads stopped: the messages still in flight complete (at most io_timeout each) or the
  // communicator is destroyed (finalized, or aborted when broken) before their reads end, so
  // done never runs while the device reads the regions.
  void Release(ControlPeer* link) override {
    Peer* p = static_cast<Peer*>(link);
    for (auto& [raw, f] : p->in_flight) {
      if (f.event != nullptr) {
        p->comm->WaitFor(f.event, absl::Now() + options().io_timeout, nullptr).IgnoreError();
      }
    }
    std::vector<std::shared_ptr<SenderTransfer>> reading;
    for (auto& [raw, f] : p->in_flight) {
      Orphan(p, f);
      reading.push_back(f.transfer);
    }
    p->in_flight.clear();
    const int device = p->comm->device();
    for (void* e : p->spare_events) p->comm->FreeEvent(e);
    p->spare_events.clear();
    p->comm.reset();
    DeviceGuard guard(device);
    for (HeaderSlot& slot : p->orphan_slots) {
      cudaFreeHost(slot.host);
      cudaFree(slot.device);
    }
    p->orphan_slots.clear();
    for (void* e : p->orphan_events) cudaEventDestroy(static_cast<cudaEvent_t>(e));
    p->orphan_events.clear();
    for (auto& t : reading) core().EndRead(t);
  }

  // What a transfer whose messages may not have completed held is not reused: freed once the
  // communicator is gone (Release).
  static void Orphan(Peer* p, InFlight& f) {
    for (HeaderSlot& slot : f.slots) p->orphan_slots.push_back(slot);
    f.slots.clear();
    if (f.event != nullptr) p->orphan_events.push_back(f.event);
    f.event = nullptr;
  }

  static Communicator* Comm(ControlPeer* p) { return static_cast<Peer*>(p)->comm.get(); }
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvSender>> CreateSender(const SenderOptions& options,
                                                       KvRegionAccess* access) {
  absl::Status s = SenderCore::CheckOptions(options, access);
  if (!s.ok()) return s;
  if (!options.control_channel) {
    return absl::InvalidArgumentError("nccl kv transport needs SenderOptions.control_channel");
  }
  if (options.max_communicators <= 0) {
    return absl::InvalidArgumentError("max_communicators must be positive");
  }
  s = CheckDevice(options.cuda_device);
  if (!s.ok()) return s;
  return std::unique_ptr<KvSender>(new NcclSender(options, access));
}

}  // namespace tandem::kvtransfer::nccl
