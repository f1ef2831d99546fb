#include "kvtransfer/control_receiver.h"

#include <unistd.h>
#include <atomic>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/cluster/kv_transfer_layout.h"
#include "kvtransfer/peer_pool.h"

namespace tandem::kvtransfer {
namespace {

std::atomic<uint64_t> g_names{0};

// How long FINISH waits for an outcome decided on another thread.
constexpr auto kOutcomeWait = std::chrono::seconds(10);

}  // namespace

void AttemptOutcome::Set(const absl::Status& s) {
  std::lock_guard<std::mutex> lock(mu);
  if (set) return;
  set = true;
  status = s;
  cv.notify_all();
}

absl::Status CheckIncarnation(const wire::Begin& b, uint64_t incarnation) {
  if (b.incarnation == incarnation) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "receiver incarnation is ", incarnation, ", transfer was reserved under ", b.incarnation));
}

ReceiverCore::AttemptStart AttemptFromBegin(wire::Begin b, uint64_t owner, uint64_t sender_id) {
  ReceiverCore::AttemptStart start;
  start.proof = std::move(b.proof);
  start.binding = ControlBinding(sender_id);
  start.transfer_id = b.transfer_id;
  start.attempt = b.attempt;
  start.dst_blocks = std::move(b.dst_blocks);
  start.owner = owner;
  start.deadline =
      b.deadline_ms < 0 ? absl::InfiniteFuture() : absl::Now() + absl::Milliseconds(b.deadline_ms);
  return start;
}

absl::Status SenderAborted(const absl::Status& status) {
  return absl::Status(status.ok() ? absl::StatusCode::kAborted : status.code(),
                      absl::StrCat("sender aborted: ", status.message()));
}

ControlReceiver::ControlReceiver(const ReceiverOptions& options, KvRegionAccess* access,
                                 CompletionCallback on_complete, Config config)
    : options_(options),
      config_(std::move(config)),
      name_(options.name.empty() ? absl::StrCat(config_.transport, "-", getpid(), "-", ++g_names)
                                 : options.name),
      incarnation_(options.incarnation != 0 ? options.incarnation : NewIncarnation()),
      core_(std::make_unique<ReceiverCore>(options.layout, access, std::move(on_complete),
                                           options.deadline_grace, options.max_transfer_time,
                                           config_.thread_name, options.hooks)) {}

// Normally a no-op: the subclass's destructor closed already (the hooks are gone by now).
ControlReceiver::~ControlReceiver() {
  Close();
  core_.reset();
}

void ControlReceiver::Close() {
  core_->Shutdown();
  std::unordered_map<uint64_t, std::shared_ptr<ReceiverPeer>> peers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
    closing_ = true;
    peers.swap(peers_);
  }
  for (auto& [id, p] : peers) ClosePeer(p.get());
}

void ControlReceiver::Cancel(uint64_t transfer_id, ReleasedCallback released) {
  core_->Cancel(transfer_id, WritesOver(transfer_id), std::move(released));
}

absl::StatusOr<std::string> ControlReceiver::HandleControl(const std::string& bytes) {
  ControlRequest req;
  core_->counters().control_received.fetch_add(1, std::memory_order_relaxed);
  core_->counters().control_sent.fetch_add(1, std::memory_order_relaxed);  // its answer
  absl::Status s =
      DecodeRequest(bytes, config_.kinds.first, config_.kinds.last, config_.transport, &req);
  if (!s.ok()) return s;
  const ControlKinds& k = config_.kinds;
  if (req.kind == k.connect) return Connect(req);
  if (req.kind == k.begin) return Begin(req);
  if (req.kind == k.finish) return Finish(req);
  if (req.kind == k.abort) return Abort(req);
  if (req.kind == k.disconnect) {
    DropPeer(req.sender_id, absl::UnavailableError("the sender disconnected"));
    return ResultReply(0, 0, absl::OkStatus());
  }
  return HandleLink(req);
}

absl::StatusOr<std::string> ControlReceiver::HandleLink(const ControlRequest& request) {
  return absl::DataLossError(absl::StrCat("unknown ", config_.transport, " control request"));
}

absl::StatusOr<std::string> ControlReceiver::Connect(const ControlRequest& req) {
  ConnectArgs args;
  absl::Status s = ParseConnect(req.body, &args);
  if (s.ok()) s = CheckKvLayoutCompatible(options_.layout, args.hello.layout);
  if (!s.ok()) {
    core_->counters().handshakes_refused.fetch_add(1, std::memory_order_relaxed);
    return RefuseReply(s);
  }
  // A sender that connects again lost its previous link: what it had in flight fails. At the
  // cap, the least recently used peer makes room.
  std::shared_ptr<ReceiverPeer> old;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(req.sender_id);
    if (it == peers_.end() && config_.max_peers > 0 &&
        static_cast<int>(peers_.size()) >= config_.max_peers) {
      it = PickVictim(peers_);
      if (it == peers_.end()) {
        return ResultReply(0, 0,
                           absl::ResourceExhaustedError(
                               absl::StrCat("all ", config_.max_peers, " ", config_.transport,
                                            " peers of the receiver are busy")));
      }
    }
    if (it != peers_.end()) {
      old = std::move(it->second);
      peers_.erase(it);
    }
  }
  if (old) EndPeer(old, absl::UnavailableError("the sender reconnected, or its link was evicted"));
  absl::StatusOr<std::shared_ptr<ReceiverPeer>> peer =
      OpenPeer(req.sender_id, core_->NewOwnerId(), args);
  if (!peer.ok()) return ResultReply(0, 0, peer.status());
  (*peer)->last_used_at = absl::Now();
  std::shared_ptr<ReceiverPeer> raced;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) {
      raced = *peer;
    } else {
      // A CONNECT of the same sender that raced this one installed its peer meanwhile: this
      // later one replaces it, as a reconnect does.
      std::shared_ptr<ReceiverPeer>& slot = peers_[req.sender_id];
      raced = std::move(slot);
      slot = *peer;
    }
  }
  if (raced) EndPeer(raced, absl::UnavailableError("the sender reconnected"));
  core_->counters().connects.fetch_add(1, std::memory_order_relaxed);
  wire::Welcome w;
  w.incarnation = incarnation_;
  w.layout = options_.layout;
  return WelcomeReply(w);
}

absl::StatusOr<uint64_t> ControlReceiver::OwnerOf(uint64_t sender_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(sender_id);
  if (it == peers_.end()) {
    return absl::UnavailableError(
        absl::StrCat("no ", config_.transport, " connection with this sender"));
  }
  return it->second->owner;
}

uint64_t ControlReceiver::PeerOwner(uint64_t sender_id) {
  absl::StatusOr<uint64_t> owner = OwnerOf(sender_id);
  return owner.ok() ? *owner : 0;
}

absl::StatusOr<std::string> ControlReceiver::Begin(const ControlRequest& req) {
  wire::Begin b;
  absl::Status s = wire::DecodeBegin(req.body, &b);
  if (!s.ok()) return s;
  s = CheckIncarnation(b, incarnation_);
  if (!s.ok()) return ResultReply(b.transfer_id, b.attempt, s);
  absl::StatusOr<uint64_t> owner = OwnerOf(req.sender_id);
  if (!owner.ok()) return ResultReply(b.transfer_id, b.attempt, owner.status());
  auto outcome = std::make_shared<AttemptOutcome>();
  outcome->owner = *owner;
  const AttemptKey key{b.transfer_id, b.attempt};
  s = core_->Begin(AttemptFromBegin(std::move(b), *owner, req.sender_id),
                   // The outcome stays until FINISH (or ABORT, or the peer going) took it: a
                   // failure before FINISH is what FINISH must answer.
                   [outcome](const absl::Status& st) { outcome->Set(st); });
  if (s.ok()) {
    s = AfterBegin(*owner, key);
    if (!s.ok()) core_->Abort(*owner, key.first, key.second, s);
  }
  if (s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    outcomes_[key] = outcome;
    auto it = peers_.find(req.sender_id);
    if (it != peers_.end()) it->second->last_used_at = absl::Now();
  }
  return ResultReply(key.first, key.second, s);
}

absl::StatusOr<std::string> ControlReceiver::Finish(const ControlRequest& req) {
  wire::Finish f;
  absl::Status s = wire::DecodeFinish(req.body, &f);
  if (!s.ok()) return s;
  const AttemptKey key{f.transfer_id, f.attempt};
  const uint64_t owner = PeerOwner(req.sender_id);
  std::shared_ptr<AttemptOutcome> outcome;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = outcomes_.find(key);
    // No live attempt here, or another sender's: nothing to wait for, nothing to touch.
    if (it != outcomes_.end() && it->second->owner == owner) outcome = it->second;
  }
  BeforeFinish(owner, key, f.frames, f.bytes, outcome);
  // The link's writes for the transfer still open after BeforeFinish are an older attempt's
  // (cuda-ipc: another sender's copies): the completion waits for them.
  s = core_->Finish(owner, f.transfer_id, f.attempt, f.frames, f.bytes, std::move(f.trailer),
                    WritesOver(f.transfer_id));
  if (s.ok() && outcome) {
    std::unique_lock<std::mutex> lock(outcome->mu);
    s = outcome->cv.wait_for(lock, kOutcomeWait, [&] { return outcome->set; })
            ? outcome->status
            : absl::UnavailableError("outcome unknown");
  }
  if (outcome) Forget(key, owner);
  return ResultReply(key.first, key.second, s);
}

absl::StatusOr<std::string> ControlReceiver::Abort(const ControlRequest& req) {
  wire::Outcome a;
  absl::Status s = wire::DecodeOutcome(req.body, &a);
  if (!s.ok()) return s;
  const AttemptKey key{a.transfer_id, a.attempt};
  const absl::Status why = SenderAborted(a.status);
  const uint64_t owner = PeerOwner(req.sender_id);
  OnAbort(owner, key, why);
  core_->Abort(owner, a.transfer_id, a.attempt, why);
  Forget(key, owner);
  return ResultReply(key.first, key.second, absl::OkStatus());
}

void ControlReceiver::Forget(const AttemptKey& key, uint64_t owner) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = outcomes_.find(key);
    if (it == outcomes_.end() || it->second->owner != owner) return;
    outcomes_.erase(it);
  }
  OnForget(owner, key);
}

void ControlReceiver::ForgetOwnerLocked(uint64_t owner) {
  for (auto o = outcomes_.begin(); o != outcomes_.end();) {
    o = o->second->owner == owner ? outcomes_.erase(o) : std::next(o);
  }
}

void ControlReceiver::DropPeer(uint64_t sender_id, const absl::Status& why) {
  std::shared_ptr<ReceiverPeer> peer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(sender_id);
    if (it == peers_.end()) return;
    peer = std::move(it->second);
    peers_.erase(it);
  }
  EndPeer(peer, why);
}

void ControlReceiver::EndPeer(const std::shared_ptr<ReceiverPeer>& peer, const absl::Status& why) {
  ClosePeer(peer.get());
  LinkBroken(*peer, why);
}

void ControlReceiver::LinkBroken(const ReceiverPeer& peer, const absl::Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ForgetOwnerLocked(peer.owner);
  }
  OnPeerGone(peer.owner);
  core_->FailOwner(peer.owner, why);
}

}  // namespace tandem::kvtransfer
