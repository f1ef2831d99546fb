// The loopback transport's sending side: SenderCore over links to receivers found in the
// registry. One worker thread per sender (the "connection") does the links' work in order,
// copying regions with memcpy; callbacks and deadlines run on the core's event loop.

#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kvtransfer/auth.h"
#include "kvtransfer/crc32c.h"
#include "kvtransfer/event_loop.h"
#include "kvtransfer/faults.h"
#include "kvtransfer/loopback/loopback.h"
#include "kvtransfer/loopback/registry.h"
#include "kvtransfer/receiver_core.h"
#include "kvtransfer/sender_core.h"

namespace tandem::kvtransfer::loopback {
namespace {

class SenderImpl;

// The way to one receiver: its Peer and the owner id its ReceiverCore knows this sender by.
// The work runs on the sender's worker thread, which checks that the peer is alive itself
// (healthy() would need the peer's lock, which is taken before the core's).
class Link : public SenderLink {
 public:
  Link(SenderImpl* impl, std::string endpoint, std::shared_ptr<Peer> peer, uint64_t owner)
      : endpoint(std::move(endpoint)), peer(std::move(peer)), owner(owner), impl_(impl) {}
  void Send(SenderWork work) override;
  bool healthy() const override { return true; }

  const std::string endpoint;
  const std::shared_ptr<Peer> peer;
  const uint64_t owner;

 private:
  SenderImpl* const impl_;
};

absl::Status PeerGone(const std::string& endpoint) {
  return absl::UnavailableError(
      absl::StrCat("kv transfer connection to ", endpoint, " lost: receiver gone"));
}

class SenderImpl : public std::enable_shared_from_this<SenderImpl> {
 public:
  SenderImpl(const SenderOptions& options, KvRegionAccess* access)
      : access_(access),
        faults_(ResolveFaultOptions(options.faults, options.faults_from_env)),
        worker_("kvt-loop-work", absl::ZeroDuration(), nullptr),
        core_(options, access, "kvt-loop-send", [this] { CheckPeers(); }) {}

  SenderCore& core() { return core_; }

  void Shutdown() {
    core_.Shutdown();
    worker_.Stop();  // runs the queued ABORTs; copies of ended transfers are skipped
    core_.Stop();
  }

  absl::StatusOr<TransferHandle> Begin(const TransferTarget& target,
                                       std::vector<int32_t> src_blocks) {
    absl::Status s = core_.CheckBegin(target, src_blocks);
    if (!s.ok()) return s;
    std::shared_ptr<Peer> peer = Registry::Get().Find(target.endpoint);
    if (peer == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("kv transfer peer ", target.endpoint, " unreachable: no such endpoint"));
    }
    std::shared_ptr<Link> link;
    {
      std::shared_lock<std::shared_mutex> lock(peer->mu);
      if (!peer->alive) {
        return absl::UnavailableError(
            absl::StrCat("kv transfer peer ", target.endpoint, " is gone"));
      }
      const KvLayout& layout = core_.options().layout;
      s = CheckKvLayoutCompatible(layout, peer->layout);
      if (!s.ok()) {
        core_.counters().handshakes_refused.fetch_add(1, std::memory_order_relaxed);
        peer->core->counters().handshakes_refused.fetch_add(1, std::memory_order_relaxed);
        // Worded from the receiver's side, as tcp's REFUSE is.
        s = CheckKvLayoutCompatible(peer->layout, layout);
        return absl::FailedPreconditionError(absl::StrCat(
            "kv transfer peer ", target.endpoint, " refused the connection: ", s.message()));
      }
      if (peer->incarnation != target.incarnation) {
        return absl::FailedPreconditionError(absl::StrCat(
            "kv transfer peer ", target.endpoint, " has incarnation ", peer->incarnation,
            " but the blocks were reserved under incarnation ", target.incarnation,
            " (the receiver restarted; its reservations are gone)"));
      }
      link = LinkFor(target.endpoint, peer);
    }
    return core_.Start(target, std::move(src_blocks), std::move(link));
  }

  // On the worker thread.
  void Do(const SenderWork& work) {
    const std::shared_ptr<SenderTransfer>& t = work.transfer;
    switch (work.kind) {
      case SenderWork::Kind::kBegin:
        return DoBegin(t);
      case SenderWork::Kind::kData:
        return DoData(t, work.layer, work.first, work.count);
      case SenderWork::Kind::kFinish:
        return DoFinish(t, work.trailer);
      case SenderWork::Kind::kAbort:
        return DoAbort(t, work.status);
    }
  }

  EventLoop& worker() { return worker_; }

 private:
  std::shared_ptr<Link> LinkFor(const std::string& endpoint,
                                const std::shared_ptr<Peer>& peer) {  // peer->mu held (shared)
    std::lock_guard<std::mutex> lock(links_mu_);
    auto it = links_.find(peer.get());
    if (it != links_.end()) return it->second;
    auto link = std::make_shared<Link>(this, endpoint, peer, peer->core->NewOwnerId());
    links_.emplace(peer.get(), link);
    core_.counters().connects.fetch_add(1, std::memory_order_relaxed);
    peer->core->counters().connects.fetch_add(1, std::memory_order_relaxed);
    return link;
  }

  static Link* LinkOf(const std::shared_ptr<SenderTransfer>& t) {
    return static_cast<Link*>(t->link.get());
  }

  // Runs even when the transfer already ended, so that the receiver learns of the attempt and
  // of the abort queued behind it.
  void DoBegin(const std::shared_ptr<SenderTransfer>& t) {
    Link* link = LinkOf(t);
    std::shared_lock<std::shared_mutex> lock(link->peer->mu);
    if (!link->peer->alive) return core_.End(t, PeerGone(link->endpoint), false);
    ReceiverCore::AttemptStart start;
    start.transfer_id = t->target.transfer_id;
    start.attempt = t->target.attempt;
    start.dst_blocks = t->target.dst_blocks;
    start.owner = link->owner;
    start.deadline = t->target.deadline;
    if (!t->target.transfer_key.empty()) {  // in process: nothing to bind it to
      start.proof = BeginProof(t->target.transfer_key, "", start.transfer_id, start.attempt,
                               start.dst_blocks);
    }
    std::weak_ptr<SenderImpl> weak = weak_from_this();
    absl::Status s = link->peer->core->Begin(std::move(start), [weak, t](const absl::Status& r) {
      if (auto self = weak.lock()) {
        self->core_.OnResult(t->link.get(), t->target.transfer_id, t->target.attempt, r);
      }
    });
    if (!s.ok()) core_.End(t, SenderCore::FromReceiver(t->target.endpoint, s), false);
  }

  void DoData(const std::shared_ptr<SenderTransfer>& t, int64_t layer, size_t first, size_t count) {
    if (t->Ended()) return;
    FaultInjector::Decision fault = faults_.Next();
    if (fault.any()) core_.counters().faults_injected.fetch_add(1, std::memory_order_relaxed);
    if (fault.delay > absl::ZeroDuration()) absl::SleepFor(fault.delay);
    Link* link = LinkOf(t);
    std::shared_lock<std::shared_mutex> lock(link->peer->mu);
    if (!link->peer->alive) return core_.End(t, PeerGone(link->endpoint), false);
    ReceiverCore* core = link->peer->core;
    if (fault.close) {
      core->FailOwner(link->owner, absl::UnavailableError("fault injection closed the connection"));
      return core_.End(t, absl::UnavailableError("fault injection closed the connection"), false);
    }
    const size_t region = core_.options().layout.region_bytes();
    const bool checksum = core_.options().checksum;
    t->frames_sent += 1;
    t->bytes_sent += count * region;
    if (fault.drop) return;
    std::vector<int32_t> dst(t->target.dst_blocks.begin() + first,
                             t->target.dst_blocks.begin() + first + count);
    bool reported = false;
    absl::StatusOr<ReceiverCore::Ticket> ticket = core->AdmitData(
        link->owner, t->target.transfer_id, t->target.attempt, layer, dst, &reported);
    if (!ticket.ok()) {
      return core_.End(t, SenderCore::FromReceiver(t->target.endpoint, ticket.status()), false);
    }
    absl::Status verdict;
    {
      std::lock_guard<std::mutex> src_lock(t->io_mu);
      std::lock_guard<std::mutex> dst_lock(*core->io_mutex(*ticket));
      if (!t->readable || !core->Writable(*ticket)) return;
      // Region by region, so both checksums read bytes the copy just brought into cache; the
      // corruption fault lands between the copy and the destination's checksum.
      const size_t corrupt_region =
          fault.corrupt && count > 0 ? fault.corrupt_position % count : count;
      uint32_t src_crc = 0, dst_crc = 0;
      for (size_t i = 0; i < count; ++i) {
        const uint8_t* src = access_->Region(layer, t->src_blocks[first + i]);
        std::memcpy(ticket->regions[i], src, region);
        if (i == corrupt_region)
          ticket->regions[i][(fault.corrupt_position >> 20) % region] ^= 0x5a;
        if (checksum) {
          src_crc = Crc32c(src_crc, src, region);
          dst_crc = Crc32c(dst_crc, ticket->regions[i], region);
        }
      }
      if (checksum && src_crc != dst_crc) {
        core->counters().checksum_failures.fetch_add(1, std::memory_order_relaxed);
        verdict = absl::DataLossError(absl::StrCat(
            "checksum mismatch in layer ", layer, " of transfer ", t->target.transfer_id,
            " attempt ", t->target.attempt, " (", count, " regions)"));
      }
    }
    core->EndData(*ticket, verdict);
    if (verdict.ok()) {
      core_.counters().frames.fetch_add(1, std::memory_order_relaxed);
      core_.counters().bytes.fetch_add(count * region, std::memory_order_relaxed);
    }
  }

  void DoFinish(const std::shared_ptr<SenderTransfer>& t, std::string trailer) {
    if (t->Ended()) return;
    Link* link = LinkOf(t);
    std::shared_lock<std::shared_mutex> lock(link->peer->mu);
    if (!link->peer->alive) return core_.End(t, PeerGone(link->endpoint), false);
    absl::Status s = link->peer->core->Finish(link->owner, t->target.transfer_id, t->target.attempt,
                                              t->frames_sent, t->bytes_sent, std::move(trailer));
    if (!s.ok()) core_.End(t, SenderCore::FromReceiver(t->target.endpoint, s), false);
  }

  void DoAbort(const std::shared_ptr<SenderTransfer>& t, const absl::Status& why) {
    Link* link = LinkOf(t);
    std::shared_lock<std::shared_mutex> lock(link->peer->mu);
    if (link->peer->alive) {
      link->peer->core->Abort(link->owner, t->target.transfer_id, t->target.attempt, why);
    }
  }

  // On the core's event loop: the transfers to a receiver that went away fail at once, and
  // links to it are forgotten once nothing uses them.
  void CheckPeers() {
    std::vector<std::shared_ptr<Link>> gone;
    {
      std::lock_guard<std::mutex> lock(links_mu_);
      for (auto it = links_.begin(); it != links_.end();) {
        std::shared_lock<std::shared_mutex> peer_lock(it->second->peer->mu, std::try_to_lock);
        if (!peer_lock.owns_lock() || it->second->peer->alive) {
          ++it;
          continue;
        }
        gone.push_back(it->second);
        it = it->second->idle() ? links_.erase(it) : std::next(it);
      }
    }
    for (auto& link : gone) core_.FailLink(link.get(), PeerGone(link->endpoint));
  }

  KvRegionAccess* const access_;
  FaultInjector faults_;
  std::mutex links_mu_;  // taken before the core's
  std::map<const Peer*, std::shared_ptr<Link>> links_;
  EventLoop worker_;  // the links' work, in order (the "connection")
  SenderCore core_;   // last: its event loop stops first
};

void Link::Send(SenderWork work) {
  impl_->worker().Post(
      [self = impl_->shared_from_this(), work = std::move(work)] { self->Do(work); });
}

class LoopbackSender : public CoreSender {
 public:
  explicit LoopbackSender(std::shared_ptr<SenderImpl> impl)
      : CoreSender(&impl->core()), impl_(std::move(impl)) {}
  ~LoopbackSender() override { impl_->Shutdown(); }

  absl::StatusOr<TransferHandle> Begin(const TransferTarget& target,
                                       std::vector<int32_t> src_blocks) override {
    return impl_->Begin(target, std::move(src_blocks));
  }

 private:
  std::shared_ptr<SenderImpl> impl_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvSender>> CreateSender(const SenderOptions& options,
                                                       KvRegionAccess* access) {
  absl::Status valid = SenderCore::CheckOptions(options, access);
  if (!valid.ok()) return valid;
  return std::unique_ptr<KvSender>(
      new LoopbackSender(std::make_shared<SenderImpl>(options, access)));
}

}  // namespace tandem::kvtransfer::loopback
