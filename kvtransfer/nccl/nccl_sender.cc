// The NCCL transport's sending side. One Peer per receiver endpoint: its communicator (rank 0)
// and a worker thread that issues the device sends in queue order, waiting for each message
// with a deadline, so SendLayer only enqueues. User callbacks run on the event loop.

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "kvtransfer/crc32c.h"
#include "kvtransfer/event_loop.h"
#include "kvtransfer/layout.h"
#include "kvtransfer/nccl/comm_pool.h"
#include "kvtransfer/nccl/communicator.h"
#include "kvtransfer/nccl/control.h"
#include "kvtransfer/nccl/nccl_transport.h"
#include "kvtransfer/nccl/sender_peer.h"
#include "kvtransfer/stats.h"

namespace tandem::kvtransfer::nccl {
namespace {

class NcclSender : public KvSender {
 public:
  NcclSender(const SenderOptions& options, KvRegionAccess* access)
      : options_(options),
        access_(access),
        sender_id_(std::random_device{}() * 0x100000001ull ^ absl::ToUnixNanos(absl::Now())),
        loop_("kvt-nccl-send", absl::Milliseconds(10), [this] { Tick(); }) {}

  ~NcclSender() override {
    std::unordered_map<std::string, std::shared_ptr<Peer>> peers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closing_ = true;
      std::vector<std::shared_ptr<Transfer>> live;
      for (auto& [h, t] : transfers_) live.push_back(t);
      for (auto& t : live) EndLocked(t, absl::AbortedError("kv sender shut down"), true);
      transfers_.clear();
      peers.swap(peers_);
    }
    for (auto& [ep, p] : peers) StopPeer(p, /*tell_receiver=*/true);
    for (auto& p : retired_) StopPeer(p, false);
    loop_.Stop();
  }

  absl::StatusOr<TransferHandle> Begin(const TransferTarget& target,
                                       std::vector<int32_t> src_blocks) override {
    if (src_blocks.size() != target.dst_blocks.size()) {
      return absl::InvalidArgumentError("kv transfer source and destination counts differ");
    }
    for (int32_t b : src_blocks) {
      if (b < 0 || b >= access_->num_blocks()) {
        return absl::InvalidArgumentError(absl::StrCat("source block ", b, " outside the pool"));
      }
    }
    if (absl::Now() >= target.deadline) {
      return absl::DeadlineExceededError("kv transfer deadline passed before it began");
    }
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
    absl::Status s = Control(target.endpoint, ControlKind::kBegin, wire::EncodeBegin(b));
    if (!s.ok()) return s;
    auto t = std::make_shared<Transfer>();
    t->target = target;
    t->target.deadline = std::min(target.deadline, absl::Now() + options_.max_transfer_time);
    t->src_blocks = std::move(src_blocks);
    t->peer = *peer;
    t->started = absl::Now();
    t->layer_queued.assign(static_cast<size_t>(options_.layout.num_layers), false);
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return absl::CancelledError("kv sender shutting down");
    if (t->peer->broken) return absl::UnavailableError("nccl communicator lost");
    t->handle = next_handle_++;
    transfers_.emplace(t->handle, t);
    t->peer->active += 1;
    t->peer->last_used = absl::Now();
    counters_.transfers_started.fetch_add(1, std::memory_order_relaxed);
    return t->handle;
  }

  void SendLayer(TransferHandle handle, int64_t layer) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = transfers_.find(handle);
    if (it == transfers_.end() || it->second->ended) return;
    std::shared_ptr<Transfer> t = it->second;
    if (layer < 0 || layer >= options_.layout.num_layers || t->layer_queued[layer]) {
      EndLocked(t,
                absl::InvalidArgumentError(absl::StrCat("SendLayer(", layer, ") invalid or twice")),
                true);
      return;
    }
    t->layer_queued[layer] = true;
    const size_t per = std::clamp<size_t>(
        options_.max_message_bytes / options_.layout.region_bytes(), 1, kMaxBlocksPerMessage);
    for (size_t first = 0; first < t->src_blocks.size(); first += per) {
      Item item;
      item.transfer = t;
      item.layer = layer;
      item.first = first;
      item.count = std::min(per, t->src_blocks.size() - first);
      Enqueue(t->peer.get(), std::move(item));
    }
  }

  void Finish(TransferHandle handle, std::string trailer, DoneCallback done) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = transfers_.find(handle);
    if (it == transfers_.end() || it->second->finish_called) {
      if (done)
        loop_.Post([done] { done(absl::NotFoundError("unknown or finished kv transfer")); });
      return;
    }
    std::shared_ptr<Transfer> t = it->second;
    t->finish_called = true;
    t->done = std::move(done);
    if (t->ended) {
      if (!t->device_busy) PostDone(t);
      return;
    }
    for (size_t l = 0; l < t->layer_queued.size(); ++l) {
      if (!t->layer_queued[l]) {
        EndLocked(t, absl::FailedPreconditionError(absl::StrCat("finished before layer ", l)),
                  true);
        return;
      }
    }
    Item item;
    item.kind = Item::Kind::kFinish;
    item.transfer = t;
    item.trailer = std::move(trailer);
    Enqueue(t->peer.get(), std::move(item));
  }

  void Abort(TransferHandle handle) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = transfers_.find(handle);
    if (it == transfers_.end()) return;
    std::shared_ptr<Transfer> t = it->second;
    EndLocked(t, absl::AbortedError("kv transfer aborted by the sender"), true);
    if (!t->finish_called) transfers_.erase(handle);
  }

  int64_t num_in_flight() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(transfers_.size());
  }
  TransportStats stats() const override { return counters_.Snapshot(); }

 private:
  absl::Status Control(const std::string& endpoint, ControlKind kind, std::string body,
                       ControlReply* reply_out = nullptr, std::string unique_id = "") {
    if (!options_.control_channel) {
      return absl::FailedPreconditionError("nccl kv transport needs SenderOptions.control_channel");
    }
    ControlRequest req{kind, sender_id_, std::move(unique_id), std::move(body)};
    absl::StatusOr<std::string> bytes = options_.control_channel(endpoint, EncodeRequest(req));
    if (!bytes.ok()) {
      return absl::UnavailableError(
          absl::StrCat("kv transfer peer ", endpoint, " unreachable: ", bytes.status().message()));
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
    absl::Status s =
        Control(target.endpoint, ControlKind::kConnect, wire::EncodeHello(hello), &reply, *id);
    if (!s.ok()) {
      if (absl::IsFailedPrecondition(s)) {
        counters_.handshakes_refused.fetch_add(1, std::memory_order_relaxed);
      }
      return s;
    }
    wire::Welcome welcome;
    s = wire::DecodeWelcome(reply.body, &welcome);
    if (s.ok()) s = CheckCompatible(options_.layout, welcome.layout);
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
    counters_.connects.fetch_add(1, std::memory_order_relaxed);
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

  void Enqueue(Peer* p, Item item) {
    {
      std::lock_guard<std::mutex> lock(p->mu);
      p->queue.push_back(std::move(item));
    }
    p->cv.notify_one();
  }

  void StopPeer(const std::shared_ptr<Peer>& p, bool tell_receiver) {
    p->stop = true;
    p->cv.notify_one();
    if (p->worker.joinable()) p->worker.join();
    if (tell_receiver && !p->broken) {
      Control(p->endpoint, ControlKind::kDisconnect, "").IgnoreError();
    }
    p->comm.reset();
  }

  void Work(Peer* p) {
    cudaSetDevice(p->comm->device());
    std::unique_lock<std::mutex> lock(p->mu);
    while (true) {
      p->cv.wait(lock, [&] { return !p->queue.empty() || p->stop; });
      if (p->queue.empty() || p->broken) return;
      Item item = std::move(p->queue.front());
      p->queue.pop_front();
      lock.unlock();
      absl::Status s = Run(p, item);
      if (!s.ok()) Broken(p, s);
      lock.lock();
      if (p->broken) return;
    }
  }

  absl::Status Run(Peer* p, Item& item) {
    std::shared_ptr<Transfer> t = item.transfer;
    if (item.kind == Item::Kind::kAbort) {  // best effort: the receiver's deadline is the backstop
      Control(p->endpoint, ControlKind::kAbort,
              wire::EncodeOutcome({t->target.transfer_id, t->target.attempt, item.status}))
          .IgnoreError();
      return absl::OkStatus();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (t->ended) return absl::OkStatus();
      if (item.kind == Item::Kind::kData) t->device_busy = true;
    }
    if (item.kind == Item::Kind::kFinish) {
      wire::Finish f{t->target.transfer_id, t->target.attempt, t->frames_sent, t->bytes_sent,
                     std::move(item.trailer)};
      absl::Status s = Control(p->endpoint, ControlKind::kFinish, wire::EncodeFinish(f));
      std::lock_guard<std::mutex> lock(mu_);
      EndLocked(t, s, /*tell_receiver=*/false);
      return absl::OkStatus();
    }
    // DATA: header, then the regions straight from the KV pool.
    const size_t region = options_.layout.region_bytes();
    MessageHeader* h = p->comm->host_header();
    std::memset(h, 0, kHeaderBytes);
    h->magic = kHeaderMagic;
    h->count = static_cast<uint32_t>(item.count);
    h->transfer_id = t->target.transfer_id;
    h->attempt = t->target.attempt;
    h->layer = static_cast<uint32_t>(item.layer);
    for (size_t i = 0; i < item.count; ++i) h->blocks[i] = t->target.dst_blocks[item.first + i];
    h->crc = Crc32c(0, h, kHeaderBytes);
    absl::Status s = p->comm->HeaderToDevice();
    if (s.ok()) s = p->comm->Send(p->comm->device_header(), kHeaderBytes);
    if (s.ok()) s = p->comm->GroupStart();
    for (size_t i = 0; s.ok() && i < item.count; ++i) {
      s = p->comm->Send(access_->Region(item.layer, t->src_blocks[item.first + i]), region);
    }
    if (s.ok()) s = p->comm->GroupEnd();
    if (s.ok()) {
      s = p->comm->Wait(std::min(t->target.deadline, absl::Now() + options_.io_timeout), &p->stop);
    }
    t->frames_sent += 1;
    t->bytes_sent += item.count * region;
    if (s.ok()) {
      counters_.frames.fetch_add(1, std::memory_order_relaxed);
      counters_.bytes.fetch_add(item.count * region, std::memory_order_relaxed);
    }
    std::lock_guard<std::mutex> lock(mu_);
    t->device_busy = false;
    if (t->done_deferred) PostDone(t);
    return s;
  }

  void Broken(Peer* p, const absl::Status& s) {
    p->broken = true;
    p->comm->Abort();
    std::lock_guard<std::mutex> lock(mu_);
    counters_.connections_lost.fetch_add(1, std::memory_order_relaxed);
    std::vector<std::shared_ptr<Transfer>> victims;
    for (auto& [h, t] : transfers_) {
      if (t->peer.get() == p && !t->ended) victims.push_back(t);
    }
    for (auto& t : victims) {
      EndLocked(t,
                absl::Status(s.code(), absl::StrCat("nccl kv transfer to ", p->endpoint,
                                                    " failed: ", s.message())),
                false);
    }
    auto it = peers_.find(p->endpoint);
    if (it != peers_.end() && it->second.get() == p) {
      retired_.push_back(it->second);
      peers_.erase(it);
    }
  }

  void PostDone(const std::shared_ptr<Transfer>& t) {  // mu_ held
    t->done_deferred = false;
    if (t->done) loop_.Post([done = std::move(t->done), s = t->outcome] { done(s); });
    t->done = nullptr;
    transfers_.erase(t->handle);
  }

  void EndLocked(const std::shared_ptr<Transfer>& t, const absl::Status& status,
                 bool tell_receiver) {
    if (t->ended) return;
    t->ended = true;
    t->outcome = status;
    t->peer->active -= 1;
    t->peer->last_used = absl::Now();
    if (status.ok()) {
      counters_.transfers_ok.fetch_add(1, std::memory_order_relaxed);
      counters_.RecordLatency(absl::Now() - t->started);
    } else {
      counters_.transfers_failed.fetch_add(1, std::memory_order_relaxed);
      if (absl::IsDeadlineExceeded(status)) {
        counters_.deadline_expired.fetch_add(1, std::memory_order_relaxed);
      }
      if (tell_receiver && !t->peer->broken) {
        Item item;
        item.kind = Item::Kind::kAbort;
        item.transfer = t;
        item.status = status;
        Enqueue(t->peer.get(), std::move(item));
      }
    }
    if (t->finish_called) {
      // The regions may still be read by a message on the wire: done waits for it.
      if (t->device_busy) {
        t->done_deferred = true;
      } else {
        PostDone(t);
      }
    }
  }

  void Tick() {
    std::vector<std::shared_ptr<Peer>> to_stop;
    {
      const absl::Time now = absl::Now();
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<std::shared_ptr<Transfer>> expired;
      for (auto& [h, t] : transfers_) {
        if (!t->ended && now >= t->target.deadline) expired.push_back(t);
      }
      for (auto& t : expired) {
        EndLocked(t, absl::DeadlineExceededError("nccl kv transfer passed its deadline"), true);
      }
      for (auto it = retired_.begin(); it != retired_.end();) {
        if ((*it)->active == 0) {
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
  const uint64_t sender_id_;
  StatsCounters counters_;
  mutable std::mutex mu_;
  bool closing_ = false;
  TransferHandle next_handle_ = 1;
  std::unordered_map<TransferHandle, std::shared_ptr<Transfer>> transfers_;
  std::unordered_map<std::string, std::shared_ptr<Peer>> peers_;  // the pool
  std::vector<std::shared_ptr<Peer>> retired_;  // replaced or evicted, stopped when unused
  EventLoop loop_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvSender>> CreateSender(const SenderOptions& options,
                                                       KvRegionAccess* access) {
  absl::Status s = ValidateLayout(options.layout);
  if (!s.ok()) return s;
  if (access == nullptr) return absl::InvalidArgumentError("kv sender needs region access");
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
