// The NCCL transport's receiving side: the control-channel receiver shell (control_receiver.h)
// whose link with each sender is a communicator (rank 1) and a thread that receives message
// headers and then the regions straight into the reserved blocks.

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/cluster/kv_transfer_layout.h"
#include "kvtransfer/control_receiver.h"
#include "kvtransfer/crc32c.h"
#include "kvtransfer/nccl/communicator.h"
#include "kvtransfer/nccl/control.h"
#include "kvtransfer/nccl/nccl_transport.h"
#include "kvtransfer/receiver_core.h"

namespace tandem::kvtransfer::nccl {
namespace {

ReceiverOptions WithFaults(ReceiverOptions o) {
  o.faults = ResolveFaultOptions(o.faults, o.faults_from_env);
  return o;
}

// One sender connected to this receiver: its communicator and the thread that receives on it.
struct ReceiverLink : ReceiverPeer {
  std::unique_ptr<Communicator> comm;
  std::thread thread;
  std::atomic<bool> stop{false};
};

class NcclReceiver : public ControlReceiver {
 public:
  NcclReceiver(const ReceiverOptions& options, KvRegionAccess* access,
               CompletionCallback on_complete)
      : ControlReceiver(WithFaults(options), access, std::move(on_complete),
                        {"nccl", "kvt-nccl-recv", kNcclKinds, options.max_communicators}),
        faults_(this->options().faults),
        access_(access),
        max_run_regions_(MaxRunRegions(options.layout, access)) {}

  ~NcclReceiver() override { Close(); }

 private:
  using ProgressKey = std::tuple<uint64_t, uint64_t, uint32_t>;  // owner, transfer id, attempt

  // How many regions one ncclRecv takes: up to kMaxRunBytes when every layer's consecutive
  // block ids are adjacent in the pool (a sender may then merge them), else 1.
  static uint32_t MaxRunRegions(const KvLayout& layout, KvRegionAccess* access) {
    const size_t region = layout.region_bytes();
    const size_t most = std::max<size_t>(1, kMaxRunBytes / region);
    for (int64_t l = 0; l < layout.num_layers; ++l) {
      for (int32_t b = 0; b + 1 < access->num_blocks(); ++b) {
        if (access->Region(l, b + 1) != access->Region(l, b) + region) return 1;
      }
    }
    return static_cast<uint32_t>(std::min<size_t>(most, kMaxBlocksPerMessage));
  }

  absl::Status ParseConnect(absl::string_view body, ConnectArgs* args) override {
    absl::string_view hello;
    absl::Status s = DecodeConnect(body, &args->link, &hello);
    return s.ok() ? wire::DecodeHello(hello, &args->hello) : s;
  }

  absl::StatusOr<std::shared_ptr<ReceiverPeer>> OpenPeer(uint64_t sender_id, uint64_t owner,
                                                         const ConnectArgs& args) override {
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        Communicator::Start(args.link, /*rank=*/1, options().cuda_device,
                            max_run_regions_ * options().layout.region_bytes());
    if (!comm.ok()) return comm.status();
    auto peer = std::make_shared<ReceiverLink>();
    peer->sender_id = sender_id;
    peer->owner = owner;
    peer->comm = *std::move(comm);
    ReceiverLink* raw = peer.get();
    peer->thread = std::thread([this, raw] { Serve(raw); });  // finishes the setup there
    return peer;
  }

  std::string WelcomeReply(const wire::Welcome& welcome) override {
    return EncodeReply({wire::FrameType::kWelcome,
                        EncodeWelcomeBody(wire::EncodeWelcome(welcome), max_run_regions_)});
  }

  // The sender waited for its last message to complete, so ours completed too; give the peer
  // thread the time to account for it.
  void BeforeFinish(uint64_t owner, const AttemptKey& key, uint64_t frames, uint64_t bytes,
                    const std::shared_ptr<AttemptOutcome>& outcome) override {
    if (outcome == nullptr) return;  // no live attempt of this sender: nothing to wait for
    const ProgressKey p{owner, key.first, key.second};
    std::unique_lock<std::mutex> lock(mu_);
    progress_cv_.wait_for(lock, absl::ToChronoMilliseconds(options().io_timeout), [&] {
      if (progress_[p] >= frames) return true;
      std::lock_guard<std::mutex> o(outcome->mu);
      return outcome->set;
    });
    progress_.erase(p);
  }

  void OnForget(uint64_t owner, const AttemptKey& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    progress_.erase({owner, key.first, key.second});
  }

  void OnPeerGone(uint64_t owner) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = progress_.begin(); it != progress_.end();) {
      it = std::get<0>(it->first) == owner ? progress_.erase(it) : std::next(it);
    }
    progress_cv_.notify_all();  // a FINISH waiting for the link: its outcome is decided now
  }

  void ClosePeer(ReceiverPeer* peer) override {
    ReceiverLink* p = static_cast<ReceiverLink*>(peer);
    p->stop = true;
    if (p->thread.joinable()) p->thread.join();
    p->comm.reset();
  }

  void Serve(ReceiverLink* p) {
    cudaSetDevice(p->comm->device());
    absl::Status s = p->comm->WaitReady(absl::Now() + options().handshake_timeout, &p->stop);
    const size_t region = options().layout.region_bytes();
    while (s.ok()) {
      s = p->comm->Recv(p->comm->device_header(), kHeaderBytes);
      if (s.ok()) s = p->comm->HeaderToHost();
      if (s.ok()) s = p->comm->Wait(absl::InfiniteFuture(), &p->stop);  // idle between messages
      if (!s.ok()) break;
      MessageHeader h = *p->comm->host_header();
      const uint32_t crc = h.crc;
      h.crc = 0;
      std::vector<std::pair<size_t, size_t>> runs;  // (first region, regions)
      if (h.magic != kHeaderMagic || h.count > kMaxBlocksPerMessage ||
          Crc32c(0, &h, kHeaderBytes) != crc || !Runs(h, &runs)) {
        s = absl::DataLossError("corrupt nccl kv message header");
        break;
      }
      std::vector<int32_t> blocks(h.blocks, h.blocks + h.count);
      bool reported = false;
      absl::StatusOr<ReceiverCore::Ticket> ticket =
          core().AdmitData(p->owner, h.transfer_id, h.attempt, h.layer, blocks, &reported);
      const absl::Time deadline = absl::Now() + options().io_timeout;
      absl::Status refused;  // the attempt's, when the message is refused after admission
      if (ticket.ok()) {
        // Held until the regions landed: Cancel waits for a message in flight.
        std::lock_guard<std::mutex> io(*core().io_mutex(*ticket));
        bool writable = core().Writable(*ticket);
        // A run lands with one ncclRecv: its blocks must be adjacent here too, else nothing of
        // the message is written (a sender that merged what it was not told to).
        for (const auto& [first, n] : runs) {
          for (size_t i = first + 1; writable && i < first + n; ++i) {
            if (ticket->regions[i] != ticket->regions[i - 1] + region) {
              writable = false;
              refused = absl::InvalidArgumentError(
                  absl::StrCat("nccl kv message merges blocks ", blocks[i - 1], " and ", blocks[i],
                               " that are not adjacent in the receiver's pool"));
            }
          }
        }
        const bool misplace = writable && faults_.Chance(options().faults.kv_misplace);
        s = p->comm->GroupStart();
        for (size_t r = 0; s.ok() && r < runs.size(); ++r) {
          const auto [first, n] = runs[r];
          void* dst = writable ? ticket->regions[first] : p->comm->device_scratch();
          if (misplace) dst = Misplaced(h.layer, blocks[first], n);  // fault injection
          s = p->comm->Recv(dst, n * region);
          core().counters().device_copies.fetch_add(1, std::memory_order_relaxed);
        }
        if (s.ok()) s = p->comm->GroupEnd();
        if (s.ok()) s = p->comm->Wait(deadline, &p->stop);
      } else {
        for (size_t r = 0; s.ok() && r < runs.size(); ++r) {  // drain
          s = p->comm->Recv(p->comm->device_scratch(), runs[r].second * region);
          if (s.ok()) s = p->comm->Wait(deadline, &p->stop);
        }
      }
      if (ticket.ok()) core().EndData(*ticket, s.ok() ? refused : s);
      if (!s.ok()) break;
      std::lock_guard<std::mutex> lock(mu_);
      progress_[ProgressKey{p->owner, h.transfer_id, h.attempt}] += 1;
      progress_cv_.notify_all();
    }
    if (!p->stop) {
      core().counters().connections_lost.fetch_add(1, std::memory_order_relaxed);
      TLOG(WARNING) << "nccl kv communicator with sender " << p->sender_id
                    << " failed: " << s.message();
    }
    LinkBroken(*p,
               absl::UnavailableError(absl::StrCat("nccl kv communicator lost: ", s.message())));
  }

  // The header's runs, checked: bit 0 clear, every run at most max_run_regions_ long (so a
  // refused one fits the scratch); false when not.
  bool Runs(const MessageHeader& h, std::vector<std::pair<size_t, size_t>>* runs) const {
    if (h.count > 0 && Joined(h, 0)) return false;
    for (size_t i = h.count; i < kJoinedBytes * 8; ++i) {
      if (Joined(h, i)) return false;
    }
    for (size_t i = 0; i < h.count; ++i) {
      if (!Joined(h, i)) runs->push_back({i, 0});
      if (++runs->back().second > max_run_regions_) return false;
    }
    return true;
  }

  // Fault injection (kv_misplace): where a run of `n` regions from `block` lands one block off,
  // inside the pool (one block back at its end).
  void* Misplaced(int64_t layer, int32_t block, size_t n) {
    const int64_t blocks = access_->num_blocks();
    if (n == 1) return access_->Region(layer, static_cast<int32_t>((block + 1) % blocks));
    if (block + static_cast<int64_t>(n) < blocks) return access_->Region(layer, block + 1);
    return access_->Region(layer, block > 0 ? block - 1 : block);
  }

  FaultInjector faults_;
  KvRegionAccess* const access_;
  const uint32_t max_run_regions_;
  std::mutex mu_;
  std::condition_variable progress_cv_;
  std::map<ProgressKey, uint64_t> progress_;  // DATA messages handled per attempt
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
