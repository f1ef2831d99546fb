// The NCCL transport's sending side: SenderCore over one Peer per receiver endpoint, its
// communicator (rank 0) and a worker thread that issues the device sends in queue order,
// waiting for each message with a deadline, so SendLayer only enqueues. User callbacks run on
// the core's event loop.

#include <algorithm>
#include <cstring>
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
#include "kvtransfer/crc32c.h"
#include "kvtransfer/nccl/comm_pool.h"
#include "kvtransfer/nccl/communicator.h"
#include "kvtransfer/nccl/control.h"
#include "kvtransfer/nccl/nccl_transport.h"
#include "kvtransfer/nccl/sender_peer.h"
#include "kvtransfer/sender_core.h"

namespace tandem::kvtransfer::nccl {
namespace {

SenderOptions WithFaults(SenderOptions o) {
  o.faults = ResolveFaultOptions(o.faults, o.faults_from_env);
  return o;
}

class NcclSender : public CoreSender {
 public:
  NcclSender(const SenderOptions& options, KvRegionAccess* access)
      : CoreSender(&core_),
        options_(WithFaults(options)),
        access_(access),
        sender_id_(std::random_device{}() * 0x100000001ull ^ absl::ToUnixNanos(absl::Now())),
        core_(
            options, access, "kvt-nccl-send", [this] { StopRetired(); }, kMaxBlocksPerMessage) {}

  ~NcclSender() override {
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
    if (!options_.control_channel) {
      return absl::FailedPreconditionError("nccl kv transport needs SenderOptions.control_channel");
    }
    if (kind != ControlKind::kConnect && faults_.Chance(options_.faults.kv_control_drop)) {
      return absl::UnavailableError(
          absl::StrCat("kv transfer peer ", endpoint, ": control message lost (fault injection)"));
    }
    ControlRequest req{kind, sender_id_, std::move(body)};
    absl::StatusOr<std::string> bytes = options_.control_channel(endpoint, EncodeRequest(req));
    if (!bytes.ok()) {
      // A refused proof of the shared secret keeps its code (as tcp's handshake); everything
      // else means the peer could not be reached.
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

  absl::StatusOr<std::shared_ptr<Peer>> GetPeer(const TransferTarget& target) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = peers_.find(target.endpoint);
      if (it != peers_.end() && !it->second->broken &&
          it->second->incarnation == target.incarnation) {
        return it->second;
      }
      if (it == peers_.end() && static_cast<int>(peers_.size()) >= options_.max_communicators) {
        auto victim = PickVictim(peers_);
        if (victim == peers_.end()) {
          return absl::ResourceExhaustedError(
              absl::StrCat("all ", options_.max_communicators, " nccl communicators are busy"));
        }
        retired_.push_back(victim->second);
        peers_.erase(victim);
      }
    }
    absl::StatusOr<std::string> id = NewUniqueId();
    if (!id.ok()) return id.status();
    wire::Hello hello;
    hello.layout = options_.layout;
    ControlReply reply;
    absl::Status s = Control(target.endpoint, ControlKind::kConnect,
                             EncodeConnect(*id, wire::EncodeHello(hello)), &reply);
    if (!s.ok()) {
      if (absl::IsFailedPrecondition(s)) {
        core_.counters().handshakes_refused.fetch_add(1, std::memory_order_relaxed);
      }
      return s;
    }
    wire::Welcome welcome;
    s = wire::DecodeWelcome(reply.body, &welcome);
    if (s.ok()) s = CheckKvLayoutCompatible(options_.layout, welcome.layout);
    if (!s.ok()) return absl::FailedPreconditionError(s.message());
    auto peer = std::make_shared<Peer>();
    peer->endpoint = target.endpoint;
    peer->incarnation = welcome.incarnation;
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        Communicator::Start(*id, /*rank=*/0, options_.cuda_device, 0);
    if (!comm.ok()) return comm.status();
    s = (*comm)->WaitReady(absl::Now() + options_.connect_timeout, nullptr);
    if (!s.ok()) return s;
    peer->comm = std::move(*comm);
    core_.counters().connects.fetch_add(1, std::memory_order_relaxed);
    Peer* raw = peer.get();
    peer->worker = std::thread([this, raw] { Work(raw); });
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = peers_[target.endpoint];
    if (slot) retired_.push_back(slot);
    slot = peer;
    if (peer->incarnation != target.incarnation) {
      return absl::FailedPreconditionError(
          absl::StrCat("kv transfer peer ", target.endpoint, " has incarnation ", peer->incarnation,
                       " but the blocks were reserved under incarnation ", target.incarnation));
    }
    return peer;
  }

  void StopPeer(const std::shared_ptr<Peer>& p, bool tell_receiver) {
    p->stop = true;
    p->cv.notify_one();
    if (p->worker.joinable()) p->worker.join();
    if (tell_receiver && !p->broken) {
      Control(p->endpoint, ControlKind::kDisconnect, "").IgnoreError();
    }
    p->comm.reset();
    std::lock_guard<std::mutex> lock(p->mu);
    p->queue.clear();  // what a broken peer left: its transfers hold the peer
  }

  void Work(Peer* p) {
    cudaSetDevice(p->comm->device());
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

  absl::Status Run(Peer* p, SenderWork& work) {
    const std::shared_ptr<SenderTransfer>& t = work.transfer;
    if (work.kind == SenderWork::Kind::kAbort) {  // best effort: the receiver's deadline is
                                                  // the backstop
      Control(p->endpoint, ControlKind::kAbort,
              wire::EncodeOutcome({t->target.transfer_id, t->target.attempt, work.status}))
          .IgnoreError();
      return absl::OkStatus();
    }
    if (work.kind == SenderWork::Kind::kFinish) {
      if (t->Ended()) return absl::OkStatus();
      wire::Finish f{t->target.transfer_id, t->target.attempt, t->frames_sent, t->bytes_sent,
                     std::move(work.trailer)};
      core_.End(t, Control(p->endpoint, ControlKind::kFinish, wire::EncodeFinish(f)),
                /*tell_receiver=*/false);
      return absl::OkStatus();
    }
    // DATA: header, then the regions straight from the KV pool, read by the device until the
    // message completed: done waits for EndRead.
    if (!core_.StartRead(t)) return absl::OkStatus();
    const size_t region = options_.layout.region_bytes();
    MessageHeader* h = p->comm->host_header();
    std::memset(h, 0, kHeaderBytes);
    h->magic = kHeaderMagic;
    h->count = static_cast<uint32_t>(work.count);
    h->transfer_id = t->target.transfer_id;
    h->attempt = t->target.attempt;
    h->layer = static_cast<uint32_t>(work.layer);
    for (size_t i = 0; i < work.count; ++i) h->blocks[i] = t->target.dst_blocks[work.first + i];
    h->crc = Crc32c(0, h, kHeaderBytes);
    absl::Status s = p->comm->HeaderToDevice();
    if (s.ok()) s = p->comm->Send(p->comm->device_header(), kHeaderBytes);
    if (s.ok()) s = p->comm->GroupStart();
    for (size_t i = 0; s.ok() && i < work.count; ++i) {
      s = p->comm->Send(access_->Region(work.layer, t->src_blocks[work.first + i]), region);
    }
    if (s.ok()) s = p->comm->GroupEnd();
    if (s.ok()) {
      s = p->comm->Wait(std::min(t->target.deadline, absl::Now() + options_.io_timeout), &p->stop);
    }
    t->frames_sent += 1;
    t->bytes_sent += work.count * region;
    if (s.ok()) {
      core_.counters().frames.fetch_add(1, std::memory_order_relaxed);
      core_.counters().bytes.fetch_add(work.count * region, std::memory_order_relaxed);
    }
    core_.EndRead(t);
    return s;
  }

  void Broken(Peer* p, const absl::Status& s) {
    p->broken = true;
    p->comm->Abort();
    core_.counters().connections_lost.fetch_add(1, std::memory_order_relaxed);
    core_.FailLink(p, absl::Status(s.code(), absl::StrCat("nccl kv transfer to ", p->endpoint,
                                                          " failed: ", s.message())));
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(p->endpoint);
    if (it != peers_.end() && it->second.get() == p) {
      retired_.push_back(it->second);
      peers_.erase(it);
    }
  }

  // On the core's event loop: peers replaced or evicted are stopped once nothing uses them.
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
  FaultInjector faults_{options_.faults};
  const uint64_t sender_id_;
  std::mutex mu_;  // the pool; taken before the core's
  bool closing_ = false;
  std::unordered_map<std::string, std::shared_ptr<Peer>> peers_;  // the pool
  std::vector<std::shared_ptr<Peer>> retired_;  // replaced or evicted, stopped when unused
  SenderCore core_;                             // last: its event loop stops first
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
