#include "kvtransfer/control_sender.h"

#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kvtransfer/auth.h"
#include "kvtransfer/control_message.h"
#include "kvtransfer/tcp/wire.h"

namespace tandem::kvtransfer {
namespace {

// A device stream that failed or missed its deadline, or a link that is gone (nccl: the
// communicator aborted), is unusable: its peer breaks.
bool BreaksPeer(const absl::Status& s) {
  return absl::IsDeadlineExceeded(s) || absl::IsCancelled(s) || absl::IsInternal(s) ||
         absl::IsUnavailable(s);
}

SenderOptions WithFaults(SenderOptions o) {
  o.faults = ResolveFaultOptions(o.faults, o.faults_from_env);
  return o;
}

}  // namespace

void ControlPeer::Send(SenderWork work) {
  if (work.kind == SenderWork::Kind::kBegin) return;
  {
    std::lock_guard<std::mutex> lock(mu);
    queue.push_back(std::move(work));
  }
  cv.notify_one();
}

ControlSender::ControlSender(const SenderOptions& options, KvRegionAccess* access, Config config)
    : CoreSender(&core_),
      options_(WithFaults(options)),
      access_(access),
      config_(std::move(config)),
      sender_id_(NewSenderId()),
      core_(
          options, access, config_.thread_name, [this] { StopRetired(); },
          config_.max_blocks_per_message) {}

// Normally a no-op: the subclass's destructor closed already (the hooks are gone by now).
ControlSender::~ControlSender() { Close(); }

void ControlSender::Close() {
  core_.Shutdown();  // queues the ABORTs
  PeerMap peers;
  std::vector<std::shared_ptr<ControlPeer>> retired;
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

absl::StatusOr<TransferHandle> ControlSender::Begin(const TransferTarget& target,
                                                    std::vector<int32_t> src_blocks) {
  absl::Status s = core_.CheckBegin(target, src_blocks, /*zero_copy_capable=*/true);
  if (!s.ok()) return s;
  absl::StatusOr<std::shared_ptr<ControlPeer>> peer = GetPeer(target);
  if (!peer.ok()) return peer.status();
  if (target.zero_copy) {
    s = CheckZeroCopy(peer->get(), target);
    if (!s.ok()) return s;
  }
  wire::Begin b;
  b.transfer_id = target.transfer_id;
  b.attempt = target.attempt;
  b.incarnation = target.incarnation;
  b.deadline_ms = target.deadline == absl::InfiniteFuture()
                      ? -1
                      : absl::ToInt64Milliseconds(target.deadline - absl::Now());
  b.dst_blocks = target.dst_blocks;
  if (!target.transfer_key.empty()) {
    b.proof = BeginProof(target.transfer_key, ControlBinding(sender_id_), b.transfer_id, b.attempt,
                         b.dst_blocks);
  }
  s = Control(target.endpoint, config_.kinds.begin, wire::EncodeBegin(b));
  if (!s.ok()) return s;
  return core_.Start(target, std::move(src_blocks), *std::move(peer));
}

absl::Status ControlSender::Control(const std::string& endpoint, uint8_t kind, std::string body,
                                    ControlReply* reply_out, SenderTransfer* transfer) {
  if (!options_.control_channel) {
    return absl::FailedPreconditionError(
        absl::StrCat(config_.transport, " kv transport needs SenderOptions.control_channel"));
  }
  core_.counters().control_sent.fetch_add(1, std::memory_order_relaxed);
  if (transfer != nullptr) transfer->control_sent.fetch_add(1, std::memory_order_relaxed);
  if (kind != config_.kinds.connect && faults_.Chance(options_.faults.kv_control_drop)) {
    return absl::UnavailableError(
        absl::StrCat("kv transfer peer ", endpoint, ": control message lost (fault injection)"));
  }
  absl::StatusOr<std::string> bytes =
      options_.control_channel(endpoint, EncodeRequest({kind, sender_id_, std::move(body)}));
  if (!bytes.ok()) {
    // A refused proof of the shared secret keeps its code (as tcp's handshake); everything
    // else means the peer could not be reached.
    const bool refused = bytes.status().code() == absl::StatusCode::kUnauthenticated;
    return absl::Status(
        refused ? absl::StatusCode::kUnauthenticated : absl::StatusCode::kUnavailable,
        absl::StrCat("kv transfer peer ", endpoint,
                     refused ? " refused: " : " unreachable: ", bytes.status().message()));
  }
  core_.counters().control_received.fetch_add(1, std::memory_order_relaxed);
  if (transfer != nullptr) transfer->control_received.fetch_add(1, std::memory_order_relaxed);
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

absl::Status ControlSender::Handshake(const std::string& endpoint, std::string body,
                                      ControlReply* reply) {
  absl::Status s = Control(endpoint, config_.kinds.connect, std::move(body), reply);
  if (absl::IsFailedPrecondition(s)) {
    core_.counters().handshakes_refused.fetch_add(1, std::memory_order_relaxed);
  }
  return s;
}

absl::Status ControlSender::IncarnationMismatch(const std::string& endpoint, uint64_t have,
                                                uint64_t want) {
  return absl::FailedPreconditionError(
      absl::StrCat("kv transfer peer ", endpoint, " has incarnation ", have,
                   " but the blocks were reserved under incarnation ", want));
}

std::shared_ptr<ControlPeer> ControlSender::UsablePeer(const TransferTarget& target) {
  auto it = peers_.find(target.endpoint);
  if (it != peers_.end() && !it->second->broken && it->second->incarnation == target.incarnation) {
    return it->second;
  }
  return nullptr;
}

absl::StatusOr<std::shared_ptr<ControlPeer>> ControlSender::GetPeer(const TransferTarget& target) {
  std::shared_ptr<std::mutex> connecting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto peer = UsablePeer(target)) return peer;
    std::shared_ptr<std::mutex>& m = connecting_[target.endpoint];
    if (m == nullptr) m = std::make_shared<std::mutex>();
    connecting = m;
  }
  // One connect per endpoint at a time: Begins that raced for a new endpoint share the peer the
  // first one connects (each connecting anew would replace, and so break, the one before).
  std::lock_guard<std::mutex> one(*connecting);
  absl::StatusOr<std::shared_ptr<ControlPeer>> peer = ConnectLocked(target);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = connecting_.find(target.endpoint);
  if (it != connecting_.end() && it->second.use_count() == 2) connecting_.erase(it);  // us + map
  return peer;
}

absl::StatusOr<std::shared_ptr<ControlPeer>> ControlSender::ConnectLocked(
    const TransferTarget& target) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto peer = UsablePeer(target)) return peer;
    auto it = peers_.find(target.endpoint);
    if (it == peers_.end()) {
      absl::StatusOr<PeerMap::iterator> victim = PickEviction(peers_);
      if (!victim.ok()) return victim.status();
      if (*victim != peers_.end()) {
        retired_.push_back((*victim)->second);
        peers_.erase(*victim);
      }
    }
  }
  absl::StatusOr<std::shared_ptr<ControlPeer>> connected = Connect(target);
  if (!connected.ok()) return connected.status();
  std::shared_ptr<ControlPeer> peer = *std::move(connected);
  core_.counters().connects.fetch_add(1, std::memory_order_relaxed);
  ControlPeer* raw = peer.get();
  peer->worker = std::thread([this, raw] { Work(raw); });
  peer->finisher = std::thread([this, raw] { FinishWork(raw); });
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = peers_[target.endpoint];
  if (slot) retired_.push_back(slot);
  slot = peer;
  if (peer->incarnation != target.incarnation) {
    return IncarnationMismatch(target.endpoint, peer->incarnation, target.incarnation);
  }
  return peer;
}

void ControlSender::StopPeer(const std::shared_ptr<ControlPeer>& p, bool tell_receiver) {
  p->stop = true;
  p->cv.notify_one();
  if (p->worker.joinable()) p->worker.join();  // then the finisher drains what it was handed
  if (p->finisher.joinable()) p->finisher.join();
  if (tell_receiver && !p->broken) {
    Control(p->endpoint, config_.kinds.disconnect, "").IgnoreError();
  }
  {
    std::lock_guard<std::mutex> lock(p->mu);
    p->queue.clear();  // what a broken peer left: its transfers hold the peer
    p->finishing.clear();
  }
  Release(p.get());
}

void ControlSender::Work(ControlPeer* p) {
  StartWorker(p);
  std::unique_lock<std::mutex> lock(p->mu);
  while (true) {
    p->cv.wait(lock, [&] { return !p->queue.empty() || p->stop || p->broken; });
    if (p->queue.empty() || p->broken) break;
    SenderWork work = std::move(p->queue.front());
    p->queue.pop_front();
    if (work.kind == SenderWork::Kind::kFinish || work.kind == SenderWork::Kind::kAbort) {
      // The transfer's DATA items were all queued (and handed to SendData) before this.
      lock.unlock();
      BeforeFinishing(p, work);
      lock.lock();
      p->finishing.push_back(std::move(work));
      p->finish_cv.notify_one();
      continue;
    }
    lock.unlock();
    absl::Status s = Run(p, work);
    work = SenderWork();  // drop the transfer reference outside the lock
    if (!s.ok()) Broken(p, s);
    lock.lock();
    if (p->broken) break;
  }
  p->worker_done = true;
  p->finish_cv.notify_one();
}

void ControlSender::FinishWork(ControlPeer* p) {
  StartWorker(p);
  std::unique_lock<std::mutex> lock(p->mu);
  while (true) {
    p->finish_cv.wait(lock, [&] { return !p->finishing.empty() || p->worker_done || p->broken; });
    if (p->broken || (p->finishing.empty() && p->worker_done)) return;
    if (p->finishing.empty()) continue;
    SenderWork work = std::move(p->finishing.front());
    p->finishing.pop_front();
    lock.unlock();
    absl::Status s = Run(p, work);
    work = SenderWork();
    if (!s.ok()) Broken(p, s);
    lock.lock();
  }
}

// A failure returned here breaks the peer.
absl::Status ControlSender::Run(ControlPeer* p, SenderWork& work) {
  const std::shared_ptr<SenderTransfer>& t = work.transfer;
  const uint64_t id = t->target.transfer_id;
  const uint32_t attempt = t->target.attempt;
  if (work.kind == SenderWork::Kind::kAbort) {
    // The copies in flight land (or fail) first: ABORT tells the receiver nothing writes the
    // blocks any more. Best effort: the receiver's deadline is the backstop.
    absl::Status settled = SettleReads(p, t);
    Control(p->endpoint, config_.kinds.abort, wire::EncodeOutcome({id, attempt, work.status}),
            nullptr, t.get())
        .IgnoreError();
    ReportControl(*t);
    return BreaksPeer(settled) ? settled : absl::OkStatus();
  }
  if (work.kind == SenderWork::Kind::kFinish) {
    absl::Status copied = SettleReads(p, t);
    if (BreaksPeer(copied)) return copied;
    if (t->Ended()) return absl::OkStatus();
    if (!copied.ok()) {  // ABORT follows, with the reason
      core_.End(t, copied, /*tell_receiver=*/true);
      return absl::OkStatus();
    }
    wire::Finish f{id, attempt, t->frames_sent, t->bytes_sent, std::move(work.trailer)};
    core_.End(t,
              Control(p->endpoint, config_.kinds.finish, wire::EncodeFinish(f), nullptr, t.get()),
              /*tell_receiver=*/false);
    ReportControl(*t);
    return absl::OkStatus();
  }
  // DATA: the regions are read (by the device) until SendData returned: done waits for EndRead.
  if (!core_.StartRead(t)) return absl::OkStatus();
  absl::Status s = SendData(p, work);
  core_.EndRead(t);
  return s;
}

void ControlSender::ReportControl(const SenderTransfer& t) {
  if (options_.hooks == nullptr) return;
  // BEGIN, exchanged before the transfer existed, and what followed.
  options_.hooks->ControlMessages(1 + t.control_sent.load(std::memory_order_relaxed),
                                  1 + t.control_received.load(std::memory_order_relaxed));
}

void ControlSender::Broken(ControlPeer* p, const absl::Status& s) {
  if (p->broken.exchange(true)) return;  // the worker's and the finisher's: once
  {
    // Wake the other thread: it stops at once.
    std::lock_guard<std::mutex> lock(p->mu);
    p->cv.notify_one();
    p->finish_cv.notify_one();
  }
  OnBroken(p);
  core_.counters().connections_lost.fetch_add(1, std::memory_order_relaxed);
  core_.FailLink(p, absl::Status(s.code(), absl::StrCat(config_.transport, " kv transfer to ",
                                                        p->endpoint, " failed: ", s.message())));
  std::lock_guard<std::mutex> lock(mu_);
  auto it = peers_.find(p->endpoint);
  if (it != peers_.end() && it->second.get() == p) {
    retired_.push_back(it->second);
    peers_.erase(it);
  }
}

void ControlSender::StopRetired() {
  std::vector<std::shared_ptr<ControlPeer>> to_stop;
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

}  // namespace tandem::kvtransfer
