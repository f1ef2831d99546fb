// The cuda-ipc transport's receiving side. The KV pool (one device allocation) is exported once
// at creation; every sender on the same GPU maps it and writes the reserved regions itself.
// The receiver stays in charge of what may be written: each device copy is admitted first (DATA:
// ReceiverCore::AdmitData against the expectation) and reported done (LANDED) right after, so
// Cancel can wait for the copy in flight before the blocks are reused.

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/kv_transfer_layout.h"
#include "common/base/log.h"
#include "kvtransfer/control_receiver.h"
#include "kvtransfer/cuda_ipc/cuda_ipc_transport.h"
#include "kvtransfer/cuda_ipc/device.h"
#include "kvtransfer/cuda_ipc/ipc_control.h"
#include "kvtransfer/receiver_core.h"

namespace tandem::kvtransfer::cuda_ipc {
namespace {

std::atomic<uint64_t> g_names{0};

uint64_t RandomU64() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
         static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
}

using AttemptKey = std::pair<uint64_t, uint32_t>;

// A copy the receiver admitted and the sender has not reported landed yet. The sender waits
// for its stream at most io_timeout, so after `deadline` the copy is over either way.
struct OpenCopy {
  uint64_t owner = 0;
  ReceiverCore::Ticket ticket;
  absl::Time deadline;
};

class IpcReceiver : public KvReceiver {
 public:
  IpcReceiver(const ReceiverOptions& options, KvRegionAccess* access, PoolExport pool,
              CompletionCallback on_complete)
      : options_(options),
        name_(options.name.empty() ? absl::StrCat("cuda-ipc-", getpid(), "-", ++g_names)
                                   : options.name),
        incarnation_(options.incarnation != 0 ? options.incarnation : RandomU64() | 1),
        pool_(std::move(pool)),
        core_(std::make_unique<ReceiverCore>(options.layout, access, std::move(on_complete),
                                             options.deadline_grace, options.max_transfer_time,
                                             "kvt-ipc-recv", options.hooks)) {}

  ~IpcReceiver() override {
    core_->Shutdown();
    core_.reset();
  }

  std::string endpoint() const override { return name_; }
  uint64_t incarnation() const override { return incarnation_; }
  void Expect(const Expectation& e) override { core_->Expect(e); }
  int64_t num_in_flight() const override { return core_->num_in_flight(); }
  TransportStats stats() const override { return core_->counters().Snapshot(); }

  // Nothing admits a new copy of the transfer once the core forgot it; then wait for its
  // copies in flight (the sender reports each landed right after its stream completed), each
  // at most until its deadline (a sender that died mid-copy, or whose LANDED was lost).
  void Cancel(uint64_t id) override {
    core_->Cancel(id);
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      const absl::Time now = absl::Now();
      absl::Time until = absl::InfinitePast();
      for (auto it = open_.begin(); it != open_.end();) {
        if (it->first.first != id) {
          ++it;
        } else if (it->second.deadline <= now) {
          TLOG(WARNING) << "cuda-ipc: transfer " << id << " attempt " << it->first.second
                        << ": its admitted copy was never reported landed";
          it = open_.erase(it);
        } else {
          until = std::max(until, it->second.deadline);
          ++it;
        }
      }
      if (until == absl::InfinitePast()) return;
      landed_cv_.wait_for(lock, absl::ToChronoMicroseconds(until - now));
    }
  }

  absl::StatusOr<std::string> HandleControl(const std::string& bytes) override {
    ControlRequest req;
    absl::Status s = DecodeIpcRequest(bytes, &req);
    if (!s.ok()) return s;
    switch (req.kind) {
      case ControlKind::kConnect:
        return Connect(req);
      case ControlKind::kBegin:
        return Begin(req);
      case ControlKind::kData:
        return Data(req);
      case ControlKind::kLanded: {
        wire::Outcome o;
        s = wire::DecodeOutcome(req.body, &o);
        if (!s.ok()) return s;
        Land(PeerOwner(req.sender_id), {o.transfer_id, o.attempt}, o.status);
        return ResultReply(o.transfer_id, o.attempt, absl::OkStatus());
      }
      case ControlKind::kFinish:
        return Finish(req);
      case ControlKind::kAbort: {
        wire::Outcome a;
        s = wire::DecodeOutcome(req.body, &a);
        if (!s.ok()) return s;
        const absl::Status why = SenderAborted(a.status);
        const uint64_t owner = PeerOwner(req.sender_id);
        Land(owner, {a.transfer_id, a.attempt}, why);
        core_->Abort(owner, a.transfer_id, a.attempt, why);
        Forget({a.transfer_id, a.attempt}, owner);
        return ResultReply(a.transfer_id, a.attempt, absl::OkStatus());
      }
      case ControlKind::kDisconnect:
        DropPeer(req.sender_id, absl::UnavailableError("the sender disconnected"));
        return ResultReply(0, 0, absl::OkStatus());
    }
    return absl::DataLossError("unknown cuda-ipc control request");
  }

 private:
  absl::StatusOr<std::string> Connect(const ControlRequest& req) {
    std::string device;
    wire::Hello hello;
    absl::Status s = DecodeConnect(req.body, &device, &hello);
    if (s.ok()) s = CheckKvLayoutCompatible(options_.layout, hello.layout);
    if (s.ok() && device != pool_.device) {
      s = absl::FailedPreconditionError(absl::StrCat(
          "cuda-ipc needs the sender and the receiver on one GPU: the receiver is on ",
          pool_.device, ", the sender on ", device, " (use --kv-transport nccl or auto)"));
    }
    if (!s.ok()) {
      core_->counters().handshakes_refused.fetch_add(1, std::memory_order_relaxed);
      return RefuseReply(s);
    }
    // A sender that connects again lost its previous connection: what it had in flight fails.
    DropPeer(req.sender_id, absl::UnavailableError("the sender reconnected"));
    const uint64_t owner = core_->NewOwnerId();
    {
      std::lock_guard<std::mutex> lock(mu_);
      peers_[req.sender_id] = owner;
    }
    core_->counters().connects.fetch_add(1, std::memory_order_relaxed);
    wire::Welcome w;
    w.incarnation = incarnation_;
    w.layout = options_.layout;
    return WelcomeReply(w, pool_);
  }

  absl::StatusOr<uint64_t> OwnerOf(uint64_t sender_id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = peers_.find(sender_id);
    if (it == peers_.end())
      return absl::UnavailableError("no cuda-ipc connection with this sender");
    return it->second;
  }

  // The owner id of the sender's connection; 0 (no attempt's) for a sender without one.
  uint64_t PeerOwner(uint64_t sender_id) {
    absl::StatusOr<uint64_t> owner = OwnerOf(sender_id);
    return owner.ok() ? *owner : 0;
  }

  absl::StatusOr<std::string> Begin(const ControlRequest& req) {
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
                     // The outcome stays until FINISH (or ABORT, or the peer going) took
                     // it: a failure before FINISH is what FINISH must answer.
                     [outcome](const absl::Status& st) { outcome->Set(st); });
    if (s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      outcomes_[key] = outcome;
    }
    return ResultReply(key.first, key.second, s);
  }

  // Admits one device copy: the sender writes the regions only after an OK.
  absl::StatusOr<std::string> Data(const ControlRequest& req) {
    wire::DataMeta d;
    absl::Status s = wire::DecodeDataMeta(req.body, &d);
    if (!s.ok()) return s;
    absl::StatusOr<uint64_t> owner = OwnerOf(req.sender_id);
    if (!owner.ok()) return ResultReply(d.transfer_id, d.attempt, owner.status());
    const AttemptKey key{d.transfer_id, d.attempt};
    Land(*owner, key, absl::DataLossError("a new copy was asked for before the last one landed"));
    if (d.payload_len != d.blocks.size() * options_.layout.region_bytes()) {
      return ResultReply(d.transfer_id, d.attempt,
                         absl::InvalidArgumentError("cuda-ipc DATA of the wrong size"));
    }
    bool reported = false;
    absl::StatusOr<ReceiverCore::Ticket> ticket =
        core_->AdmitData(*owner, d.transfer_id, d.attempt, d.layer, d.blocks, &reported);
    if (!ticket.ok()) return ResultReply(d.transfer_id, d.attempt, ticket.status());
    {
      std::lock_guard<std::mutex> io(*core_->io_mutex(*ticket));
      if (!core_->Writable(*ticket)) {
        return ResultReply(d.transfer_id, d.attempt,
                           absl::AbortedError("the attempt ended before the copy"));
      }
      std::lock_guard<std::mutex> lock(mu_);
      open_[key] = OpenCopy{*owner, *std::move(ticket), absl::Now() + options_.io_timeout};
    }
    return ResultReply(d.transfer_id, d.attempt, absl::OkStatus());
  }

  // The copy of the attempt's open DATA that `owner` made ended with `status` (another
  // sender's open copy is left alone).
  void Land(uint64_t owner, const AttemptKey& key, const absl::Status& status) {
    OpenCopy copy;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = open_.find(key);
      if (it == open_.end() || it->second.owner != owner) return;
      copy = std::move(it->second);
      open_.erase(it);
    }
    core_->EndData(copy.ticket, status);
    std::lock_guard<std::mutex> lock(mu_);
    landed_cv_.notify_all();
  }

  absl::StatusOr<std::string> Finish(const ControlRequest& req) {
    wire::Finish f;
    absl::Status s = wire::DecodeFinish(req.body, &f);
    if (!s.ok()) return s;
    const AttemptKey key{f.transfer_id, f.attempt};
    const uint64_t owner = PeerOwner(req.sender_id);
    Land(owner, key, absl::DataLossError("FINISH before the last copy landed"));
    std::shared_ptr<AttemptOutcome> outcome;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = outcomes_.find(key);
      if (it != outcomes_.end() && it->second->owner == owner) outcome = it->second;
    }
    std::string reply = FinishReply(core_.get(), owner, std::move(f), outcome);
    Forget(key, owner);
    return reply;
  }

  // Drops the outcome FINISH waits on for an attempt of `owner` (another sender's stays).
  void Forget(const AttemptKey& key, uint64_t owner) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = outcomes_.find(key);
    if (it != outcomes_.end() && it->second->owner == owner) outcomes_.erase(it);
  }

  void DropPeer(uint64_t sender_id, const absl::Status& why) {
    uint64_t owner = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = peers_.find(sender_id);
      if (it == peers_.end()) return;
      owner = it->second;
      peers_.erase(it);
      for (auto o = open_.begin(); o != open_.end();) {
        o = o->second.owner == owner ? open_.erase(o) : std::next(o);
      }
      for (auto o = outcomes_.begin(); o != outcomes_.end();) {
        o = o->second->owner == owner ? outcomes_.erase(o) : std::next(o);
      }
      landed_cv_.notify_all();
    }
    core_->FailOwner(owner, why);
  }

  const ReceiverOptions options_;
  const std::string name_;
  const uint64_t incarnation_;
  const PoolExport pool_;
  std::mutex mu_;
  std::condition_variable landed_cv_;
  std::unordered_map<uint64_t, uint64_t> peers_;  // sender id -> owner id of its attempts
  std::map<AttemptKey, std::shared_ptr<AttemptOutcome>> outcomes_;
  std::map<AttemptKey, OpenCopy> open_;
  std::unique_ptr<ReceiverCore> core_;
};

// The pool as one allocation with a regular layout, which is what the sender can address.
absl::StatusOr<PoolExport> DescribePool(const ReceiverOptions& options, KvRegionAccess* access) {
  const int64_t layers = options.layout.num_layers;
  const int64_t blocks = access->num_blocks();
  const uint64_t region = options.layout.region_bytes();
  uint8_t* base = access->Region(0, 0);
  PoolExport p;
  p.num_blocks = blocks;
  p.block_stride = blocks > 1 ? static_cast<uint64_t>(access->Region(0, 1) - base) : region;
  p.layer_stride =
      layers > 1 ? static_cast<uint64_t>(access->Region(1, 0) - base) : p.block_stride * blocks;
  for (int64_t l = 0; l < layers; ++l) {
    for (int32_t b : {0, static_cast<int32_t>(blocks - 1)}) {
      if (access->Region(l, b) != base + l * p.layer_stride + b * p.block_stride) {
        return absl::FailedPreconditionError(
            "cuda-ipc needs the KV pool in one allocation with a regular layout");
      }
    }
  }
  p.pool_bytes = (layers - 1) * p.layer_stride + (blocks - 1) * p.block_stride + region;
  absl::StatusOr<std::string> handle = ExportHandle(options.cuda_device, base);
  if (!handle.ok()) return handle.status();
  p.handle = *std::move(handle);
  absl::StatusOr<std::string> device = DeviceId(options.cuda_device);
  if (!device.ok()) return device.status();
  p.device = *std::move(device);
  p.process = ProcessToken();
  return p;
}

}  // namespace

uint64_t ProcessToken() {
  static const uint64_t token = RandomU64();
  return token;
}

absl::StatusOr<std::unique_ptr<KvReceiver>> CreateReceiver(
    const ReceiverOptions& options, KvRegionAccess* access,
    KvReceiver::CompletionCallback on_complete) {
  absl::Status s = ValidateKvLayout(options.layout);
  if (!s.ok()) return s;
  if (access == nullptr || access->num_blocks() <= 0) {
    return absl::InvalidArgumentError("kv receiver needs region access");
  }
  s = CheckDevice(options.cuda_device);
  if (!s.ok()) return s;
  absl::StatusOr<PoolExport> pool = DescribePool(options, access);
  if (!pool.ok()) return pool.status();
  return std::unique_ptr<KvReceiver>(
      new IpcReceiver(options, access, *std::move(pool), std::move(on_complete)));
}

}  // namespace tandem::kvtransfer::cuda_ipc
