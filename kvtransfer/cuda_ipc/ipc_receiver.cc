// The cuda-ipc transport's receiving side. The KV pool (one device allocation) is exported once
// at creation; every sender on the same GPU maps it and writes the reserved regions itself.
// The receiver stays in charge of what may be written: BEGIN admits the copies of every region
// of the transfer (ReceiverCore::AdmitAll against the expectation) and FINISH (or ABORT, or the
// sender's peer going) reports them over, so a Cancel's release follows the copies in flight
// before the blocks are reused.

#include <algorithm>
#include <functional>
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

// The copies of an attempt the receiver admitted at BEGIN and the sender has not reported over
// yet (FINISH, ABORT). The sender copies nothing after the attempt's deadline and waits for
// its stream at most io_timeout, so after `deadline` the copies are over either way.
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

  // Nothing admits a new copy of the transfer once the core forgot it; its copies in flight are
  // over once the sender's FINISH or ABORT reported them (after its stream completed them), its
  // peer went, or each attempt's admission ended: its deadline plus io_timeout (a sender that
  // died mid-transfer, or whose FINISH and ABORT were lost).
  std::function<bool()> WritesOver(uint64_t id) override {
    return [this, id] {
      std::lock_guard<std::mutex> lock(mu_);
      const absl::Time now = absl::Now();
      bool over = true;
      for (auto it = open_.lower_bound({id, 0}); it != open_.end() && it->first.first == id;) {
        if (it->second.deadline <= now) {
          TLOG(WARNING) << "cuda-ipc: transfer " << id << " attempt " << it->first.second
                        << ": its admitted copies were never reported over";
          it = open_.erase(it);
        } else {
          over = false;
          ++it;
        }
      }
      return over;
    };
  }

  // BEGIN admits every region of the attempt at once: the sender copies each layer as the
  // engine computes it, with no further message until FINISH.
  absl::Status AfterBegin(uint64_t owner, const AttemptKey& key) override {
    absl::StatusOr<ReceiverCore::Ticket> ticket = core().AdmitAll(owner, key.first, key.second);
    if (!ticket.ok()) return ticket.status();
    std::lock_guard<std::mutex> io(*core().io_mutex(*ticket));
    if (!core().Writable(*ticket)) return absl::AbortedError("the attempt ended before its copies");
    const absl::Time deadline = ticket->deadline + options().io_timeout;
    std::lock_guard<std::mutex> lock(mu_);
    open_[key] = OpenCopy{owner, *std::move(ticket), deadline};
    return absl::OkStatus();
  }

  // The copies `owner` was admitted for the attempt ended with `status` as `frames` DATA items
  // (another sender's open copies are left alone).
  void Land(uint64_t owner, const AttemptKey& key, const absl::Status& status,
            uint64_t frames = 1) {
    OpenCopy copy;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = open_.find(key);
      if (it == open_.end() || it->second.owner != owner) return;
      copy = std::move(it->second);
      open_.erase(it);
    }
    core().EndData(copy.ticket, status, frames);
    core().WakeReleases();  // a Cancel may wait for these copies
  }

  // FINISH: the sender's copies of the attempt landed, `bytes` in all; fewer than admitted is
  // DATA_LOSS (the core then fails the attempt).
  void BeforeFinish(uint64_t owner, const AttemptKey& key, uint64_t frames, uint64_t bytes,
                    const std::shared_ptr<AttemptOutcome>& outcome) override {
    uint64_t admitted = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = open_.find(key);
      if (it == open_.end() || it->second.owner != owner) return;
      admitted = it->second.ticket.cells.size() * options().layout.region_bytes();
    }
    Land(owner, key,
         bytes == admitted
             ? absl::OkStatus()
             : absl::DataLossError(absl::StrCat("the sender copied ", bytes, " of the ", admitted,
                                                " bytes admitted at BEGIN")),
         frames);
  }

  void OnAbort(uint64_t owner, const AttemptKey& key, const absl::Status& why) override {
    Land(owner, key, why);
  }

  void OnPeerGone(uint64_t owner) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto o = open_.begin(); o != open_.end();) {
        o = o->second.owner == owner ? open_.erase(o) : std::next(o);
      }
    }
    core().WakeReleases();
  }

  const PoolExport pool_;
  std::mutex mu_;
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
