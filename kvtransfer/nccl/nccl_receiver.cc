// The NCCL transport's receiving side. Control messages arrive through HandleControl (called
// by the worker's control service); each sender gets a Peer: a communicator (rank 1) and a
// thread that receives message headers and then the regions straight into the reserved blocks.

#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/kv_transfer_layout.h"
#include "common/base/log.h"
#include "kvtransfer/control_receiver.h"
#include "kvtransfer/crc32c.h"
#include "kvtransfer/nccl/comm_pool.h"
#include "kvtransfer/nccl/communicator.h"
#include "kvtransfer/nccl/control.h"
#include "kvtransfer/nccl/nccl_transport.h"
#include "kvtransfer/receiver_core.h"

namespace tandem::kvtransfer::nccl {
namespace {

std::atomic<uint64_t> g_names{0};

ReceiverOptions WithFaults(ReceiverOptions o) {
  o.faults = ResolveFaultOptions(o.faults, o.faults_from_env);
  return o;
}

struct Peer {
  uint64_t sender_id = 0;
  uint64_t owner = 0;
  std::unique_ptr<Communicator> comm;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<bool> broken{false};
  // Under the receiver's mutex.
  absl::Time last_used_at;
  int active = 0;
  absl::Time last_used() const { return last_used_at; }
  bool idle() const { return active == 0; }
};

using AttemptKey = std::pair<uint64_t, uint32_t>;

class NcclReceiver : public KvReceiver {
 public:
  NcclReceiver(const ReceiverOptions& options, KvRegionAccess* access,
               CompletionCallback on_complete)
      : options_(WithFaults(options)),
        faults_(options_.faults),
        access_(access),
        name_(options.name.empty() ? absl::StrCat("nccl-", getpid(), "-", ++g_names)
                                   : options.name),
        incarnation_(options.incarnation != 0
                         ? options.incarnation
                         : (static_cast<uint64_t>(std::random_device{}()) << 32) ^
                               (static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) | 1)),
        core_(std::make_unique<ReceiverCore>(options.layout, access, std::move(on_complete),
                                             options.deadline_grace, options.max_transfer_time,
                                             "kvt-nccl-recv", options.hooks)) {}

  ~NcclReceiver() override {
    core_->Shutdown();
    std::unordered_map<uint64_t, std::shared_ptr<Peer>> peers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      peers.swap(peers_);
    }
    for (auto& [id, p] : peers) Stop(p);
    core_.reset();
  }

  std::string endpoint() const override { return name_; }
  uint64_t incarnation() const override { return incarnation_; }
  void Expect(const Expectation& e) override { core_->Expect(e); }
  void Cancel(uint64_t id) override { core_->Cancel(id); }
  int64_t num_in_flight() const override { return core_->num_in_flight(); }
  TransportStats stats() const override { return core_->counters().Snapshot(); }

  absl::StatusOr<std::string> HandleControl(const std::string& bytes) override {
    ControlRequest req;
    absl::Status s = DecodeNcclRequest(bytes, &req);
    if (!s.ok()) return s;
    switch (req.kind) {
      case ControlKind::kConnect:
        return Connect(req);
      case ControlKind::kBegin:
        return Begin(req);
      case ControlKind::kFinish:
        return Finish(req);
      case ControlKind::kAbort: {
        wire::Outcome a;
        s = wire::DecodeOutcome(req.body, &a);
        if (!s.ok()) return s;
        const uint64_t owner = OwnerOf(req.sender_id);
        core_->Abort(owner, a.transfer_id, a.attempt, SenderAborted(a.status));
        Forget({a.transfer_id, a.attempt}, owner);
        return ResultReply(a.transfer_id, a.attempt, absl::OkStatus());
      }
      case ControlKind::kDisconnect: {
        std::shared_ptr<Peer> p;
        {
          std::lock_guard<std::mutex> lock(mu_);
          auto it = peers_.find(req.sender_id);
          if (it != peers_.end()) {
            p = it->second;
            peers_.erase(it);
          }
        }
        if (p) Stop(p);
        return ResultReply(0, 0, absl::OkStatus());
      }
    }
    return absl::DataLossError("unknown kv control request");
  }

 private:
  absl::StatusOr<std::string> Connect(const ControlRequest& req) {
    std::string unique_id;
    absl::string_view hello_bytes;
    absl::Status s = DecodeConnect(req.body, &unique_id, &hello_bytes);
    if (!s.ok()) return s;
    wire::Hello hello;
    s = wire::DecodeHello(hello_bytes, &hello);
    if (s.ok()) s = CheckKvLayoutCompatible(options_.layout, hello.layout);
    if (!s.ok()) {
      core_->counters().handshakes_refused.fetch_add(1, std::memory_order_relaxed);
      return RefuseReply(s);
    }
    std::shared_ptr<Peer> old;
    auto peer = std::make_shared<Peer>();
    peer->sender_id = req.sender_id;
    peer->owner = core_->NewOwnerId();
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = peers_.find(req.sender_id);
      if (it != peers_.end()) {  // the sender reconnects: its old communicator is gone
        old = it->second;
        peers_.erase(it);
      } else if (static_cast<int>(peers_.size()) >= options_.max_communicators) {
        auto victim = PickVictim(peers_);
        if (victim == peers_.end()) {
          return ResultReply(0, 0,
                             absl::ResourceExhaustedError(
                                 absl::StrCat("all ", options_.max_communicators,
                                              " nccl communicators of the receiver are busy")));
        }
        old = victim->second;
        peers_.erase(victim);
      }
    }
    if (old) Stop(old);
    absl::StatusOr<std::unique_ptr<Communicator>> comm = Communicator::Start(
        unique_id, /*rank=*/1, options_.cuda_device, options_.layout.region_bytes());
    if (!comm.ok()) return ResultReply(0, 0, comm.status());
    peer->comm = std::move(*comm);
    peer->last_used_at = absl::Now();
    Peer* raw = peer.get();
    peer->thread = std::thread([this, raw] { Serve(raw); });  // finishes the setup there
    std::shared_ptr<Peer> raced;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // A CONNECT of the same sender that raced this one installed its peer meanwhile: this
      // later one replaces it, as a reconnect does.
      std::shared_ptr<Peer>& slot = peers_[req.sender_id];
      raced = std::move(slot);
      slot = peer;
    }
    if (raced) Stop(raced);
    core_->counters().connects.fetch_add(1, std::memory_order_relaxed);
    wire::Welcome w;
    w.incarnation = incarnation_;
    w.layout = options_.layout;
    return EncodeReply({wire::FrameType::kWelcome, wire::EncodeWelcome(w)});
  }

  absl::StatusOr<std::string> Begin(const ControlRequest& req) {
    wire::Begin b;
    absl::Status s = wire::DecodeBegin(req.body, &b);
    if (!s.ok()) return s;
    s = CheckIncarnation(b, incarnation_);
    if (!s.ok()) return ResultReply(b.transfer_id, b.attempt, s);
    std::shared_ptr<Peer> peer;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = peers_.find(req.sender_id);
      if (it == peers_.end()) {
        return ResultReply(b.transfer_id, b.attempt,
                           absl::UnavailableError("no communicator with this sender"));
      }
      peer = it->second;
    }
    auto outcome = std::make_shared<AttemptOutcome>();
    outcome->owner = peer->owner;
    const AttemptKey key{b.transfer_id, b.attempt};
    s = core_->Begin(AttemptFromBegin(std::move(b), peer->owner, req.sender_id),
                     // The outcome stays until FINISH (or ABORT, or the peer going) took
                     // it: a failure before FINISH is what FINISH must answer.
                     [outcome](const absl::Status& st) { outcome->Set(st); });
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      outcomes_[key] = outcome;
      peer->last_used_at = absl::Now();
    }
    return ResultReply(key.first, key.second, s);
  }

  absl::StatusOr<std::string> Finish(const ControlRequest& req) {
    wire::Finish f;
    absl::Status s = wire::DecodeFinish(req.body, &f);
    if (!s.ok()) return s;
    const AttemptKey key{f.transfer_id, f.attempt};
    const uint64_t owner = OwnerOf(req.sender_id);
    std::shared_ptr<AttemptOutcome> outcome;
    {
      // The sender waited for its last message to complete, so ours completed too; give the
      // peer thread the time to account for it.
      std::unique_lock<std::mutex> lock(mu_);
      auto it = outcomes_.find(key);
      if (it != outcomes_.end()) outcome = it->second;
      if (outcome == nullptr || outcome->owner != owner) {
        // No live attempt here, or another sender's: nothing to wait for, nothing to touch.
        lock.unlock();
        return FinishReply(core_.get(), owner, std::move(f), nullptr);
      }
      progress_cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.io_timeout), [&] {
        return progress_[key] >= f.frames || (outcome && outcome->set);
      });
      progress_.erase(key);
    }
    std::string reply = FinishReply(core_.get(), owner, std::move(f), outcome);
    Forget(key, owner);
    return reply;
  }

  // The owner id of the sender's communicator; 0 (no attempt's) for a sender without one.
  uint64_t OwnerOf(uint64_t sender_id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(sender_id);
    return it == peers_.end() ? 0 : it->second->owner;
  }

  // Drops what FINISH waits on for an attempt of `owner` (another sender's stays).
  void Forget(const AttemptKey& key, uint64_t owner) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = outcomes_.find(key);
    if (it != outcomes_.end() && it->second->owner != owner) return;
    outcomes_.erase(key);
    progress_.erase(key);
  }

  void Stop(const std::shared_ptr<Peer>& p) {
    p->stop = true;
    if (p->thread.joinable()) p->thread.join();
    p->comm.reset();
  }

  void Serve(Peer* p) {
    cudaSetDevice(p->comm->device());
    absl::Status s = p->comm->WaitReady(absl::Now() + options_.handshake_timeout, &p->stop);
    const size_t region = options_.layout.region_bytes();
    while (s.ok()) {
      s = p->comm->Recv(p->comm->device_header(), kHeaderBytes);
      if (s.ok()) s = p->comm->HeaderToHost();
      if (s.ok()) s = p->comm->Wait(absl::InfiniteFuture(), &p->stop);  // idle between messages
      if (!s.ok()) break;
      MessageHeader h = *p->comm->host_header();
      const uint32_t crc = h.crc;
      h.crc = 0;
      if (h.magic != kHeaderMagic || h.count > kMaxBlocksPerMessage ||
          Crc32c(0, &h, kHeaderBytes) != crc) {
        s = absl::DataLossError("corrupt nccl kv message header");
        break;
      }
      std::vector<int32_t> blocks(h.blocks, h.blocks + h.count);
      bool reported = false;
      absl::StatusOr<ReceiverCore::Ticket> ticket =
          core_->AdmitData(p->owner, h.transfer_id, h.attempt, h.layer, blocks, &reported);
      const absl::Time deadline = absl::Now() + options_.io_timeout;
      if (ticket.ok()) {
        // Held until the regions landed: Cancel waits for a message in flight.
        std::lock_guard<std::mutex> io(*core_->io_mutex(*ticket));
        const bool writable = core_->Writable(*ticket);
        const bool misplace = writable && faults_.Chance(options_.faults.kv_misplace);
        s = p->comm->GroupStart();
        for (size_t i = 0; s.ok() && i < h.count; ++i) {
          void* dst = writable ? ticket->regions[i] : p->comm->device_scratch();
          if (misplace) {  // fault injection: one block off
            dst = access_->Region(h.layer, (blocks[i] + 1) % access_->num_blocks());
          }
          s = p->comm->Recv(dst, region);
        }
        if (s.ok()) s = p->comm->GroupEnd();
        if (s.ok()) s = p->comm->Wait(deadline, &p->stop);
      } else {
        for (size_t i = 0; s.ok() && i < h.count; ++i) {  // drain
          s = p->comm->Recv(p->comm->device_scratch(), region);
          if (s.ok()) s = p->comm->Wait(deadline, &p->stop);
        }
      }
      if (ticket.ok()) core_->EndData(*ticket, s);
      if (!s.ok()) break;
      std::lock_guard<std::mutex> lock(mu_);
      progress_[AttemptKey{h.transfer_id, h.attempt}] += 1;
      progress_cv_.notify_all();
    }
    p->broken = true;
    if (!p->stop) {
      core_->counters().connections_lost.fetch_add(1, std::memory_order_relaxed);
      TLOG(WARNING) << "nccl kv communicator with sender " << p->sender_id
                    << " failed: " << s.message();
    }
    core_->FailOwner(
        p->owner, absl::UnavailableError(absl::StrCat("nccl kv communicator lost: ", s.message())));
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = outcomes_.begin(); it != outcomes_.end();) {
      if (it->second->owner == p->owner) {
        progress_.erase(it->first);
        it = outcomes_.erase(it);
      } else {
        ++it;
      }
    }
  }

  const ReceiverOptions options_;
  FaultInjector faults_;
  KvRegionAccess* const access_;
  const std::string name_;
  const uint64_t incarnation_;
  std::mutex mu_;
  std::condition_variable progress_cv_;
  std::unordered_map<uint64_t, std::shared_ptr<Peer>> peers_;  // by sender id: the pool
  std::map<AttemptKey, std::shared_ptr<AttemptOutcome>> outcomes_;
  std::map<AttemptKey, uint64_t> progress_;  // DATA messages handled per attempt
  std::unique_ptr<ReceiverCore> core_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvReceiver>> CreateReceiver(
    const ReceiverOptions& options, KvRegionAccess* access,
    KvReceiver::CompletionCallback on_complete) {
  absl::Status s = ValidateKvLayout(options.layout);
  if (!s.ok()) return s;
  if (access == nullptr) return absl::InvalidArgumentError("kv receiver needs region access");
  if (options.max_communicators <= 0) {
    return absl::InvalidArgumentError("max_communicators must be positive");
  }
  s = CheckDevice(options.cuda_device);
  if (!s.ok()) return s;
  return std::unique_ptr<KvReceiver>(new NcclReceiver(options, access, std::move(on_complete)));
}

}  // namespace tandem::kvtransfer::nccl
