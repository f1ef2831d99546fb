// The NCCL transport's sending side: the control-channel sender shell (control_sender.h) over
// one Peer per receiver endpoint, its communicator (rank 0) and a worker thread that issues the
// device sends in queue order, waiting for each message with a deadline, so SendLayer only
// enqueues. At most max_communicators peers: the least recently used idle one is evicted to make
// room. User callbacks run on the core's event loop.

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
    s = wire::DecodeWelcome(reply.body, &welcome);
    if (s.ok()) s = CheckKvLayoutCompatible(options().layout, welcome.layout);
    if (!s.ok()) return absl::FailedPreconditionError(s.message());
    auto peer = std::make_shared<Peer>();
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

  // One DATA message: header, then the regions straight from the KV pool, read by the device
  // until the message completed.
  absl::Status SendData(ControlPeer* p, SenderWork& work) override {
    const std::shared_ptr<SenderTransfer>& t = work.transfer;
    Communicator* comm = Comm(p);
    const size_t region = options().layout.region_bytes();
    MessageHeader* h = comm->host_header();
    std::memset(h, 0, kHeaderBytes);
    h->magic = kHeaderMagic;
    h->count = static_cast<uint32_t>(work.count);
    h->transfer_id = t->target.transfer_id;
    h->attempt = t->target.attempt;
    h->layer = static_cast<uint32_t>(work.layer);
    for (size_t i = 0; i < work.count; ++i) h->blocks[i] = t->target.dst_blocks[work.first + i];
    h->crc = Crc32c(0, h, kHeaderBytes);
    // The layer's KV is final once the engine's event for it fired: the stream waits for it on
    // the device.
    void* ready = access()->LayerReadyEvent(work.layer);
    absl::Status s = ready != nullptr ? comm->WaitEvent(ready) : absl::OkStatus();
    if (s.ok()) s = comm->HeaderToDevice();
    if (s.ok()) s = comm->Send(comm->device_header(), kHeaderBytes);
    if (s.ok()) s = comm->GroupStart();
    for (size_t i = 0; s.ok() && i < work.count; ++i) {
      s = comm->Send(access()->Region(work.layer, t->src_blocks[work.first + i]), region);
    }
    if (s.ok()) s = comm->GroupEnd();
    if (s.ok()) {
      s = comm->Wait(std::min(t->target.deadline, absl::Now() + options().io_timeout), &p->stop);
    }
    t->frames_sent += 1;
    t->bytes_sent += work.count * region;
    if (s.ok()) {
      core().counters().frames.fetch_add(1, std::memory_order_relaxed);
      core().counters().bytes.fetch_add(work.count * region, std::memory_order_relaxed);
    }
    return s;
  }

  void OnBroken(ControlPeer* p) override { Comm(p)->Abort(); }
  void Release(ControlPeer* p) override { static_cast<Peer*>(p)->comm.reset(); }

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
