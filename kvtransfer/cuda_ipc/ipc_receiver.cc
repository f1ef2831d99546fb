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
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/cluster/kv_transfer_layout.h"
#include "kvtransfer/control_receiver.h"
#include "kvtransfer/cuda_ipc/cuda_ipc_transport.h"
#include "kvtransfer/cuda_ipc/device.h"
#include "kvtransfer/cuda_ipc/ipc_control.h"
#include "kvtransfer/receiver_core.h"

namespace tandem::kvtransfer::cuda_ipc {
namespace {

uint64_t RandomU64() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
         static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
}

// A copy the receiver admitted and the sender has not reported landed yet. The sender waits
// for its stream at most io_timeout, so after `deadline` the copy is over either way.
struct OpenCopy {
  uint64_t owner = 0;
  ReceiverCore::Ticket ticket;
  absl::Time deadline;
};

class IpcReceiver : public ControlReceiver {
 public:
  IpcReceiver(const ReceiverOptions& options, KvRegionAccess* access, PoolExport pool,
              CompletionCallback on_complete)
      : ControlReceiver(options, access, std::move(on_complete),
                        {"cuda-ipc", "kvt-ipc-recv", kIpcKinds}),
        pool_(std::move(pool)) {}

  ~IpcReceiver() override { Close(); }

 private:
  absl::Status ParseConnect(absl::string_view body, ConnectArgs* args) override {
    std::string device;
    absl::Status s = DecodeConnect(body, &device, &args->hello);
    if (s.ok() && device != pool_.device) {
      s = absl::FailedPreconditionError(absl::StrCat(
          "cuda-ipc needs the sender and the receiver on one GPU: the receiver is on ",
          pool_.device, ", the sender on ", device, " (use --kv-transport nccl or auto)"));
    }
    return s;
  }

  absl::StatusOr<std::shared_ptr<ReceiverPeer>> OpenPeer(uint64_t sender_id, uint64_t owner,
                                                         const ConnectArgs& args) override {
    auto peer = std::make_shared<ReceiverPeer>();
    peer->sender_id = sender_id;
    peer->owner = owner;
    return peer;
  }

  std::string WelcomeReply(const wire::Welcome& welcome) override {
    return cuda_ipc::WelcomeReply(welcome, pool_);
  }

  // Nothing admits a new copy of the transfer once the core forgot it; then wait for its
  // copies in flight (the sender reports each landed right after its stream completed), each
  // at most until its deadline (a sender that died mid-copy, or whose LANDED was lost).
  void WaitWrites(uint64_t id) override {
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

  absl::StatusOr<std::string> HandleLink(const ControlRequest& req) override {
    if (req.kind == ControlKind::kData) return Data(req);
    if (req.kind == ControlKind::kLanded) {
      wire::Outcome o;
      absl::Status s = wire::DecodeOutcome(req.body, &o);
      if (!s.ok()) return s;
      Land(PeerOwner(req.sender_id), {o.transfer_id, o.attempt}, o.status);
      return ResultReply(o.transfer_id, o.attempt, absl::OkStatus());
    }
    return ControlReceiver::HandleLink(req);
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
    if (d.payload_len != d.blocks.size() * options().layout.region_bytes()) {
      return ResultReply(d.transfer_id, d.attempt,
                         absl::InvalidArgumentError("cuda-ipc DATA of the wrong size"));
    }
    bool reported = false;
    absl::StatusOr<ReceiverCore::Ticket> ticket =
        core().AdmitData(*owner, d.transfer_id, d.attempt, d.layer, d.blocks, &reported);
    if (!ticket.ok()) return ResultReply(d.transfer_id, d.attempt, ticket.status());
    {
      std::lock_guard<std::mutex> io(*core().io_mutex(*ticket));
      if (!core().Writable(*ticket)) {
        return ResultReply(d.transfer_id, d.attempt,
                           absl::AbortedError("the attempt ended before the copy"));
      }
      std::lock_guard<std::mutex> lock(mu_);
      open_[key] = OpenCopy{*owner, *std::move(ticket), absl::Now() + options().io_timeout};
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
    core().EndData(copy.ticket, status);
    std::lock_guard<std::mutex> lock(mu_);
    landed_cv_.notify_all();
  }

  void BeforeFinish(uint64_t owner, const AttemptKey& key, uint64_t frames,
                    const std::shared_ptr<AttemptOutcome>& outcome) override {
    Land(owner, key, absl::DataLossError("FINISH before the last copy landed"));
  }

  void OnAbort(uint64_t owner, const AttemptKey& key, const absl::Status& why) override {
    Land(owner, key, why);
  }

  void OnPeerGone(uint64_t owner) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto o = open_.begin(); o != open_.end();) {
      o = o->second.owner == owner ? open_.erase(o) : std::next(o);
    }
    landed_cv_.notify_all();
  }

  const PoolExport pool_;
  std::mutex mu_;
  std::condition_variable landed_cv_;
  std::map<AttemptKey, OpenCopy> open_;
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
