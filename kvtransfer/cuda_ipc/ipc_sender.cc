// The cuda-ipc transport's sending side: SenderCore over one Peer per receiver endpoint. A Peer
// holds the receiver's KV pool mapped into this process (one mapping per receiver incarnation,
// closed once the last peer using it stopped), a copy stream and a worker thread that runs the
// queued work in order: for each DATA item it asks the receiver to admit the regions, copies
// them device to device, waits for the stream with a deadline and reports them landed. So
// SendLayer only enqueues, and the copies of one layer overlap the engine's next layer.

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/kv_transfer_layout.h"
#include "common/base/log.h"
#include "kvtransfer/cuda_ipc/cuda_ipc_transport.h"
#include "kvtransfer/cuda_ipc/cuda_runtime_api.h"
#include "kvtransfer/cuda_ipc/device.h"
#include "kvtransfer/cuda_ipc/ipc_control.h"
#include "kvtransfer/sender_core.h"

namespace tandem::kvtransfer::cuda_ipc {
namespace {

// Regions of one DATA item: one admission and one stream wait each.
constexpr size_t kMaxBlocksPerMessage = 4096;

SenderOptions WithFaults(SenderOptions o) {
  o.faults = ResolveFaultOptions(o.faults, o.faults_from_env);
  return o;
}

struct Peer : SenderLink {
  std::string endpoint;
  uint64_t incarnation = 0;
  PoolExport pool;
  std::shared_ptr<MappedPool> mapped;
  std::unique_ptr<CopyStream> stream;
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<SenderWork> queue;
  std::atomic<bool> stop{false};
  std::atomic<bool> broken{false};

  // BEGIN went over the control channel inside Begin already: kBegin is not queued.
  void Send(SenderWork work) override {
    if (work.kind == SenderWork::Kind::kBegin) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back(std::move(work));
    }
    cv.notify_one();
  }
  bool healthy() const override { return !broken; }
};

class IpcSender : public CoreSender {
 public:
  IpcSender(const SenderOptions& options, KvRegionAccess* access, std::string device_id)
      : CoreSender(&core_),
        options_(WithFaults(options)),
        access_(access),
        device_id_(std::move(device_id)),
        sender_id_(std::random_device{}() * 0x100000001ull ^ absl::ToUnixNanos(absl::Now())),
        core_(
            options, access, "kvt-ipc-send", [this] { StopRetired(); }, kMaxBlocksPerMessage) {}

  ~IpcSender() override {
    core_.Shutdown();  // queues the ABORTs
    std::unordered_map<std::string, std::shared_ptr<Peer>> peers;
    std::vector<std::shared_ptr<Peer>> retired;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
      peers.swap(peers_);
      retired.swap(retired_);
    }
    for (auto& [ep, p] : peers) StopPeer(p, /*tell_receiver=*/true);
    for (auto& p : retired) StopPeer(p, false);
    core_.Stop();
  }

  absl::StatusOr<TransferHandle> Begin(const TransferTarget& target,
                                       std::vector<int32_t> src_blocks) override {
    absl::Status s = core_.CheckBegin(target, src_blocks);
    if (!s.ok()) return s;
    absl::StatusOr<std::shared_ptr<Peer>> peer = GetPeer(target);
    if (!peer.ok()) return peer.status();
    wire::Begin b;
    b.transfer_id = target.transfer_id;
    b.attempt = target.attempt;
    b.incarnation = target.incarnation;
    b.deadline_ms = target.deadline == absl::InfiniteFuture()
                        ? -1
                        : absl::ToInt64Milliseconds(target.deadline - absl::Now());
    b.dst_blocks = target.dst_blocks;
    s = Control(target.endpoint, ControlKind::kBegin, wire::EncodeBegin(b));
    if (!s.ok()) return s;
    return core_.Start(target, std::move(src_blocks), *std::move(peer));
  }

 private:
  absl::Status Control(const std::string& endpoint, ControlKind kind, std::string body,
                       ControlReply* reply_out = nullptr) {
    if (kind != ControlKind::kConnect && faults_.Chance(options_.faults.kv_control_drop)) {
      return absl::UnavailableError(
          absl::StrCat("kv transfer peer ", endpoint, ": control message lost (fault injection)"));
    }
    ControlRequest req{kind, sender_id_, std::move(body)};
    absl::StatusOr<std::string> bytes = options_.control_channel(endpoint, EncodeRequest(req));
    if (!bytes.ok()) {
      const bool refused = bytes.status().code() == absl::StatusCode::kUnauthenticated;
      return absl::Status(
          refused ? absl::StatusCode::kUnauthenticated : absl::StatusCode::kUnavailable,
          absl::StrCat("kv transfer peer ", endpoint,
                       refused ? " refused: " : " unreachable: ", bytes.status().message()));
    }
    ControlReply reply;
    absl::Status s = DecodeReply(*bytes, &reply);
    if (!s.ok()) return s;
    if (reply_out != nullptr) *reply_out = reply;
    if (reply.type == wire::FrameType::kWelcome) return absl::OkStatus();
    s = ReplyStatus(reply);
    if (s.ok()) return s;
    return absl::Status(
        s.code(),
        absl::StrCat("kv transfer peer ", endpoint,
                     reply.type == wire::FrameType::kRefuse ? " refused the connection: " : ": ",
                     s.message()));
  }

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
        MappedPool::Open(options_.cuda_device, pool.handle, pool.pool_bytes);
    if (!m.ok()) return m.status();
    std::shared_ptr<MappedPool> shared = *std::move(m);
    slot = shared;
    return shared;
  }

  absl::StatusOr<std::shared_ptr<Peer>> GetPeer(const TransferTarget& target) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = peers_.find(target.endpoint);
      if (it != peers_.end() && !it->second->broken &&
          it->second->incarnation == target.incarnation) {
        return it->second;
      }
    }
    wire::Hello hello;
    hello.layout = options_.layout;
    ControlReply reply;
    absl::Status s =
        Control(target.endpoint, ControlKind::kConnect, EncodeConnect(device_id_, hello), &reply);
    if (!s.ok()) {
      if (absl::IsFailedPrecondition(s)) {
        core_.counters().handshakes_refused.fetch_add(1, std::memory_order_relaxed);
      }
      return s;
    }
    auto peer = std::make_shared<Peer>();
    wire::Welcome welcome;
    s = DecodeWelcomeBody(reply.body, &welcome, &peer->pool);
    if (!s.ok()) return s;
    s = CheckKvLayoutCompatible(options_.layout, welcome.layout);
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
      core_.counters().handshakes_refused.fetch_add(1, std::memory_order_relaxed);
      return absl::FailedPreconditionError(s.message());
    }
    peer->endpoint = target.endpoint;
    peer->incarnation = welcome.incarnation;
    if (peer->incarnation != target.incarnation) {
      // The blocks were reserved by an earlier life of the receiver: nothing is mapped for it.
      return absl::FailedPreconditionError(
          absl::StrCat("kv transfer peer ", target.endpoint, " has incarnation ", peer->incarnation,
                       " but the blocks were reserved under incarnation ", target.incarnation));
    }
    absl::StatusOr<std::shared_ptr<MappedPool>> mapped =
        Map(target.endpoint, welcome.incarnation, peer->pool);
    if (!mapped.ok()) return mapped.status();
    peer->mapped = *std::move(mapped);
    absl::StatusOr<std::unique_ptr<CopyStream>> stream = CopyStream::Create(options_.cuda_device);
    if (!stream.ok()) return stream.status();
    peer->stream = *std::move(stream);
    core_.counters().connects.fetch_add(1, std::memory_order_relaxed);
    Peer* raw = peer.get();
    peer->worker = std::thread([this, raw] { Work(raw); });
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = peers_[target.endpoint];
    if (slot) retired_.push_back(slot);
    slot = peer;
    return peer;
  }

  void StopPeer(const std::shared_ptr<Peer>& p, bool tell_receiver) {
    p->stop = true;
    p->cv.notify_one();
    if (p->worker.joinable()) p->worker.join();
    if (tell_receiver && !p->broken) {
      Control(p->endpoint, ControlKind::kDisconnect, "").IgnoreError();
    }
    {
      std::lock_guard<std::mutex> lock(p->mu);
      p->queue.clear();  // what a broken peer left: its transfers hold the peer
    }
    p->stream.reset();
    std::lock_guard<std::mutex> lock(map_mu_);
    p->mapped.reset();  // the last peer of an incarnation closes its mapping
  }

  void Work(Peer* p) {
    cudaSetDevice(options_.cuda_device);
    std::unique_lock<std::mutex> lock(p->mu);
    while (true) {
      p->cv.wait(lock, [&] { return !p->queue.empty() || p->stop; });
      if (p->queue.empty() || p->broken) return;
      SenderWork work = std::move(p->queue.front());
      p->queue.pop_front();
      lock.unlock();
      absl::Status s = Run(p, work);
      work = SenderWork();  // drop the transfer reference outside the lock
      if (!s.ok()) Broken(p, s);
      lock.lock();
      if (p->broken) return;
    }
  }

  // A failure returned here breaks the peer (the receiver is unreachable or the stream is).
  absl::Status Run(Peer* p, SenderWork& work) {
    const std::shared_ptr<SenderTransfer>& t = work.transfer;
    const uint64_t id = t->target.transfer_id;
    const uint32_t attempt = t->target.attempt;
    if (work.kind == SenderWork::Kind::kAbort) {  // best effort: the receiver's deadline is
                                                  // the backstop
      Control(p->endpoint, ControlKind::kAbort, wire::EncodeOutcome({id, attempt, work.status}))
          .IgnoreError();
      return absl::OkStatus();
    }
    if (work.kind == SenderWork::Kind::kFinish) {
      if (t->Ended()) return absl::OkStatus();
      wire::Finish f{id, attempt, t->frames_sent, t->bytes_sent, std::move(work.trailer)};
      core_.End(t, Control(p->endpoint, ControlKind::kFinish, wire::EncodeFinish(f)),
                /*tell_receiver=*/false);
      return absl::OkStatus();
    }
    if (!core_.StartRead(t)) return absl::OkStatus();
    absl::Status s = Copy(p, work);
    core_.EndRead(t);
    return s;
  }

  // One DATA item: admitted by the receiver, copied into its pool, reported landed.
  absl::Status Copy(Peer* p, SenderWork& work) {
    const std::shared_ptr<SenderTransfer>& t = work.transfer;
    const uint64_t id = t->target.transfer_id;
    const uint32_t attempt = t->target.attempt;
    const size_t region = options_.layout.region_bytes();
    wire::DataMeta d;
    d.transfer_id = id;
    d.attempt = attempt;
    d.layer = static_cast<uint32_t>(work.layer);
    d.payload_len = work.count * region;
    d.blocks.assign(t->target.dst_blocks.begin() + work.first,
                    t->target.dst_blocks.begin() + work.first + work.count);
    absl::Status s = Control(p->endpoint, ControlKind::kData, wire::EncodeDataMeta(d));
    if (absl::IsUnavailable(s) || absl::IsUnauthenticated(s)) return s;
    if (!s.ok()) {  // refused: the receiver failed the attempt and knows it
      core_.End(t, s, /*tell_receiver=*/false);
      return absl::OkStatus();
    }
    const bool misplace = faults_.Chance(options_.faults.kv_misplace);
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
                          access_->Region(work.layer, t->src_blocks[work.first + i]), region);
    }
    if (s.ok()) {
      s = p->stream->Wait(std::min(t->target.deadline, absl::Now() + options_.io_timeout),
                          &p->stop);
    }
    t->frames_sent += 1;
    t->bytes_sent += work.count * region;
    if (s.ok()) {
      core_.counters().frames.fetch_add(1, std::memory_order_relaxed);
      core_.counters().bytes.fetch_add(work.count * region, std::memory_order_relaxed);
    }
    absl::Status told =
        Control(p->endpoint, ControlKind::kLanded, wire::EncodeOutcome({id, attempt, s}));
    if (!s.ok()) {
      // A stream that missed its deadline is unusable: the peer breaks (a new one gets a new
      // stream); a refused copy fails this transfer only.
      if (absl::IsDeadlineExceeded(s) || absl::IsCancelled(s) || absl::IsInternal(s)) return s;
      core_.End(t, s, /*tell_receiver=*/false);
    }
    return absl::IsUnavailable(told) ? told : absl::OkStatus();
  }

  void Broken(Peer* p, const absl::Status& s) {
    p->broken = true;
    core_.counters().connections_lost.fetch_add(1, std::memory_order_relaxed);
    core_.FailLink(p, absl::Status(s.code(), absl::StrCat("cuda-ipc kv transfer to ", p->endpoint,
                                                          " failed: ", s.message())));
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(p->endpoint);
    if (it != peers_.end() && it->second.get() == p) {
      retired_.push_back(it->second);
      peers_.erase(it);
    }
  }

  // On the core's event loop: peers replaced or broken are stopped (and their mappings closed)
  // once nothing uses them.
  void StopRetired() {
    std::vector<std::shared_ptr<Peer>> to_stop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) return;
      for (auto it = retired_.begin(); it != retired_.end();) {
        if ((*it)->idle()) {
          to_stop.push_back(std::move(*it));
          it = retired_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& p : to_stop) StopPeer(p, /*tell_receiver=*/false);
  }

  const SenderOptions options_;
  KvRegionAccess* const access_;
  const std::string device_id_;
  FaultInjector faults_{options_.faults};
  const uint64_t sender_id_;
  std::mutex map_mu_;
  std::map<std::pair<std::string, uint64_t>, std::weak_ptr<MappedPool>> mappings_;
  std::mutex mu_;  // the peers; taken before the core's
  bool closing_ = false;
  std::unordered_map<std::string, std::shared_ptr<Peer>> peers_;
  std::vector<std::shared_ptr<Peer>> retired_;  // replaced or broken, stopped when unused
  SenderCore core_;                             // last: its event loop stops first
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
