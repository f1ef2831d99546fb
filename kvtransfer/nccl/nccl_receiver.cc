// The NCCL transport's receiving side: the control-channel receiver shell (control_receiver.h)
// whose link with each sender is a communicator (rank 1) and a thread that receives message
// headers and then the regions straight into the reserved blocks.

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
        access_(access) {}

  ~NcclReceiver() override { Close(); }

 private:
  using ProgressKey = std::tuple<uint64_t, uint64_t, uint32_t>;  // owner, transfer id, attempt

  absl::Status ParseConnect(absl::string_view body, ConnectArgs* args) override {
    absl::string_view hello;
    absl::Status s = DecodeConnect(body, &args->link, &hello);
    return s.ok() ? wire::DecodeHello(hello, &args->hello) : s;
  }

  absl::StatusOr<std::shared_ptr<ReceiverPeer>> OpenPeer(uint64_t sender_id, uint64_t owner,
                                                         const ConnectArgs& args) override {
    absl::StatusOr<std::unique_ptr<Communicator>> comm = Communicator::Start(
        args.link, /*rank=*/1, options().cuda_device, options().layout.region_bytes());
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
    return EncodeReply({wire::FrameType::kWelcome, wire::EncodeWelcome(welcome)});
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
      if (h.magic != kHeaderMagic || h.count > kMaxBlocksPerMessage ||
          Crc32c(0, &h, kHeaderBytes) != crc) {
        s = absl::DataLossError("corrupt nccl kv message header");
        break;
      }
      std::vector<int32_t> blocks(h.blocks, h.blocks + h.count);
      bool reported = false;
      absl::StatusOr<ReceiverCore::Ticket> ticket =
          core().AdmitData(p->owner, h.transfer_id, h.attempt, h.layer, blocks, &reported);
      const absl::Time deadline = absl::Now() + options().io_timeout;
      if (ticket.ok()) {
        // Held until the regions landed: Cancel waits for a message in flight.
        std::lock_guard<std::mutex> io(*core().io_mutex(*ticket));
        const bool writable = core().Writable(*ticket);
        const bool misplace = writable && faults_.Chance(options().faults.kv_misplace);
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
      if (ticket.ok()) core().EndData(*ticket, s);
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

  FaultInjector faults_;
  KvRegionAccess* const access_;
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
