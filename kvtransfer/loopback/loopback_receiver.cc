// The loopback transport's receiving side: a ReceiverCore registered under a name.

#include <atomic>
#include <utility>

#include "common/cluster/kv_transfer_layout.h"
#include "kvtransfer/loopback/loopback.h"
#include "kvtransfer/loopback/registry.h"
#include "kvtransfer/receiver_core.h"

namespace tandem::kvtransfer::loopback {
namespace {

// ---------------------------------------------------------------- receiver

class LoopbackReceiver : public KvReceiver {
 public:
  LoopbackReceiver(const ReceiverOptions& options, KvRegionAccess* access,
                   CompletionCallback on_complete, std::string name)
      : name_(std::move(name)),
        core_(std::make_unique<ReceiverCore>(options.layout, access, std::move(on_complete),
                                             options.deadline_grace, options.max_transfer_time,
                                             "kvt-loop-recv", options.hooks)),
        peer_(std::make_shared<Peer>()) {
    peer_->core = core_.get();
    peer_->layout = options.layout;
    peer_->incarnation = NewIncarnation();
  }
  ~LoopbackReceiver() override {
    core_->Shutdown();
    Registry::Get().Remove(name_);
    {
      std::unique_lock<std::shared_mutex> lock(peer_->mu);
      peer_->alive = false;
      peer_->core = nullptr;
    }
    core_.reset();
  }
  absl::Status Register() { return Registry::Get().Add(name_, peer_); }

  std::string endpoint() const override { return name_; }
  uint64_t incarnation() const override { return peer_->incarnation; }
  void Expect(const Expectation& expectation) override { core_->Expect(expectation); }
  void Cancel(uint64_t transfer_id, ReleasedCallback released) override {
    core_->Cancel(transfer_id, nullptr, std::move(released));
  }
  int64_t num_in_flight() const override { return core_->num_in_flight(); }
  TransportStats stats() const override { return core_->counters().Snapshot(); }

 private:
  const std::string name_;
  std::unique_ptr<ReceiverCore> core_;
  std::shared_ptr<Peer> peer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<KvReceiver>> CreateReceiver(
    const ReceiverOptions& options, KvRegionAccess* access,
    KvReceiver::CompletionCallback on_complete) {
  absl::Status valid = ValidateKvLayout(options.layout);
  if (!valid.ok()) return valid;
  if (access == nullptr) return absl::InvalidArgumentError("kv receiver needs region access");
  std::string name = options.name.empty() ? Registry::Get().UniqueName() : options.name;
  auto r = std::make_unique<LoopbackReceiver>(options, access, std::move(on_complete), name);
  absl::Status s = r->Register();
  if (!s.ok()) return s;
  return std::unique_ptr<KvReceiver>(std::move(r));
}

}  // namespace tandem::kvtransfer::loopback
