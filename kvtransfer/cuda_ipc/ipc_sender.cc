// The cuda-ipc transport's sending side: the control-channel sender shell (control_sender.h)
// over one Peer per receiver endpoint. A Peer holds the receiver's KV pool mapped into this
// process (one mapping per receiver incarnation, closed once the last peer using it stopped), a
// copy stream and a worker thread that runs the queued work in order: for each DATA item it asks
// the receiver to admit the regions, copies them device to device, waits for the stream with a
// deadline and reports them landed. So SendLayer only enqueues, and the copies of one layer
// overlap the engine's next layer.

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cluster/kv_transfer_layout.h"
#include "kvtransfer/control_sender.h"
#include "kvtransfer/cuda_ipc/cuda_ipc_transport.h"
#include "kvtransfer/cuda_ipc/device.h"
#include "kvtransfer/cuda_ipc/ipc_control.h"
#include "kvtransfer/cuda_runtime_api.h"
#include "kvtransfer/sender_core.h"

namespace tandem::kvtransfer::cuda_ipc {
namespace {

// Regions of one DATA item: one admission and one stream wait each.
constexpr size_t kMaxBlocksPerMessage = 4096;

// The shell's peer with the receiver's pool: its mapping and the copy stream, used by the
// worker thread and released once it stopped.
struct Peer : ControlPeer {
  PoolExport pool;
  std::shared_ptr<MappedPool> mapped;
  std::unique_ptr<CopyStream> stream;
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

  // One DATA item: admitted by the receiver, copied into its pool, reported landed. A failure
  // returned here breaks the peer (the receiver is unreachable or the stream is).
  absl::Status SendData(ControlPeer* link, SenderWork& work) override {
    Peer* p = static_cast<Peer*>(link);
    const std::shared_ptr<SenderTransfer>& t = work.transfer;
    const uint64_t id = t->target.transfer_id;
    const uint32_t attempt = t->target.attempt;
    const size_t region = options().layout.region_bytes();
    wire::DataMeta d;
    d.transfer_id = id;
    d.attempt = attempt;
    d.layer = static_cast<uint32_t>(work.layer);
    d.payload_len = work.count * region;
    d.blocks.assign(t->target.dst_blocks.begin() + work.first,
                    t->target.dst_blocks.begin() + work.first + work.count);
    absl::Status s = Control(p->endpoint, kData, wire::EncodeDataMeta(d));
    if (absl::IsUnavailable(s) || absl::IsUnauthenticated(s)) return s;
    if (!s.ok()) {  // refused: the receiver failed the attempt and knows it
      core().End(t, s, /*tell_receiver=*/false);
      return absl::OkStatus();
    }
    const bool misplace = faults().Chance(options().faults.kv_misplace);
    const PoolExport& pool = p->pool;
    for (size_t i = 0; s.ok() && i < work.count; ++i) {
      int64_t block = d.blocks[i];
      if (misplace) block = (block + 1) % pool.num_blocks;  // fault injection: one block off
      const uint64_t offset = work.layer * pool.layer_stride + block * pool.block_stride;
      if (block < 0 || offset + region > pool.pool_bytes) {
        s = absl::InvalidArgumentError(absl::StrCat("block ", block, " outside the peer's pool"));
        break;
      }
      s = p->stream->Copy(p->mapped->base() + offset,
                          access()->Region(work.layer, t->src_blocks[work.first + i]), region);
    }
    if (s.ok()) {
      s = p->stream->Wait(std::min(t->target.deadline, absl::Now() + options().io_timeout),
                          &p->stop);
    }
    t->frames_sent += 1;
    t->bytes_sent += work.count * region;
    if (s.ok()) {
      core().counters().frames.fetch_add(1, std::memory_order_relaxed);
      core().counters().bytes.fetch_add(work.count * region, std::memory_order_relaxed);
    }
    absl::Status told = Control(p->endpoint, kLanded, wire::EncodeOutcome({id, attempt, s}));
    if (!s.ok()) {
      // A stream that missed its deadline is unusable: the peer breaks (a new one gets a new
      // stream); a refused copy fails this transfer only.
      if (absl::IsDeadlineExceeded(s) || absl::IsCancelled(s) || absl::IsInternal(s)) return s;
      core().End(t, s, /*tell_receiver=*/false);
    }
    return absl::IsUnavailable(told) ? told : absl::OkStatus();
  }

  // Peers replaced or broken close their mappings once nothing uses them.
  void Release(ControlPeer* link) override {
    Peer* p = static_cast<Peer*>(link);
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
