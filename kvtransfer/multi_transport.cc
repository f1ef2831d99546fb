#include "kvtransfer/multi_transport.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kvtransfer/control_message.h"
#include "kvtransfer/receiver_core.h"

namespace tandem::kvtransfer {
namespace {

std::atomic<uint64_t> g_names{0};

absl::StatusOr<std::vector<std::string>> SplitTransports(const std::string& transport) {
  std::vector<std::string> parts = absl::StrSplit(transport, ',');
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!UsesControlChannel(parts[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("kv transports '", transport, "': only nccl and cuda-ipc combine (they ",
                       "share the KvControl endpoint), not '", parts[i], "'"));
    }
    for (size_t j = 0; j < i; ++j) {
      if (parts[j] == parts[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("kv transports '", transport, "': '", parts[i], "' twice"));
      }
    }
  }
  return parts;
}

TransportStats Sum(const TransportStats& a, const TransportStats& b) {
  TransportStats s;
  s.bytes = a.bytes + b.bytes;
  s.frames = a.frames + b.frames;
  s.transfers_started = a.transfers_started + b.transfers_started;
  s.transfers_ok = a.transfers_ok + b.transfers_ok;
  s.transfers_failed = a.transfers_failed + b.transfers_failed;
  s.checksum_failures = a.checksum_failures + b.checksum_failures;
  s.deadline_expired = a.deadline_expired + b.deadline_expired;
  s.connects = a.connects + b.connects;
  s.handshakes_refused = a.handshakes_refused + b.handshakes_refused;
  s.connections_lost = a.connections_lost + b.connections_lost;
  s.faults_injected = a.faults_injected + b.faults_injected;
  s.connections_refused = a.connections_refused + b.connections_refused;
  s.messages_refused = a.messages_refused + b.messages_refused;
  s.buffer_bytes = a.buffer_bytes + b.buffer_bytes;
  s.buffer_bytes_peak = a.buffer_bytes_peak + b.buffer_bytes_peak;
  s.transfer_micros_sum = a.transfer_micros_sum + b.transfer_micros_sum;
  s.transfer_micros_max = std::max(a.transfer_micros_max, b.transfer_micros_max);
  return s;
}

// ---------------------------------------------------------------- sender

class MultiSender : public KvSender {
 public:
  MultiSender(std::vector<std::string> names, std::vector<std::unique_ptr<KvSender>> senders)
      : names_(std::move(names)), senders_(std::move(senders)) {}

  absl::StatusOr<TransferHandle> Begin(const TransferTarget& target,
                                       std::vector<int32_t> src_blocks) override {
    size_t i = 0;
    while (i < names_.size() && names_[i] != target.transport) ++i;
    if (i == names_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("target transport '", target.transport, "': this sender speaks ",
                       absl::StrJoin(names_, ","), " (the router names one per transfer)"));
    }
    absl::StatusOr<TransferHandle> inner = senders_[i]->Begin(target, std::move(src_blocks));
    if (!inner.ok()) return inner.status();
    std::lock_guard<std::mutex> lock(mu_);
    const TransferHandle h = ++next_handle_;
    handles_[h] = {i, *inner};
    return h;
  }

  void SendLayer(TransferHandle handle, int64_t layer) override {
    if (auto r = Find(handle, /*erase=*/false)) senders_[r->first]->SendLayer(r->second, layer);
  }

  void Finish(TransferHandle handle, std::string trailer, DoneCallback done) override {
    auto r = Find(handle, /*erase=*/false);
    if (!r) {
      done(absl::InvalidArgumentError(absl::StrCat("unknown transfer handle ", handle)));
      return;
    }
    senders_[r->first]->Finish(r->second, std::move(trailer),
                               [this, handle, done = std::move(done)](absl::Status st) {
                                 Find(handle, /*erase=*/true);
                                 done(std::move(st));
                               });
  }

  void Abort(TransferHandle handle) override {
    if (auto r = Find(handle, /*erase=*/true)) senders_[r->first]->Abort(r->second);
  }

  int64_t num_in_flight() const override {
    int64_t n = 0;
    for (const auto& s : senders_) n += s->num_in_flight();
    return n;
  }

  TransportStats stats() const override {
    TransportStats s;
    for (const auto& sender : senders_) s = Sum(s, sender->stats());
    return s;
  }

  absl::StatusOr<ZeroCopyDestination> Destination(TransferHandle handle) override {
    auto r = Find(handle, /*erase=*/false);
    if (!r) return absl::NotFoundError(absl::StrCat("unknown transfer handle ", handle));
    return senders_[r->first]->Destination(r->second);
  }

 private:
  // (sender index, its handle) of `handle`, if known.
  std::optional<std::pair<size_t, TransferHandle>> Find(TransferHandle handle, bool erase) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = handles_.find(handle);
    if (it == handles_.end()) return std::nullopt;
    auto r = it->second;
    if (erase) handles_.erase(it);
    return r;
  }

  const std::vector<std::string> names_;
  std::mutex mu_;
  TransferHandle next_handle_ = 0;
  std::unordered_map<TransferHandle, std::pair<size_t, TransferHandle>> handles_;
  // Last: destroyed first, so callbacks its senders still deliver find the state above.
  const std::vector<std::unique_ptr<KvSender>> senders_;
};

// ---------------------------------------------------------------- receiver

class MultiReceiver : public KvReceiver {
 public:
  MultiReceiver(std::string endpoint, uint64_t incarnation, CompletionCallback on_complete)
      : endpoint_(std::move(endpoint)),
        incarnation_(incarnation),
        on_complete_(std::move(on_complete)) {}

  ~MultiReceiver() override {
    // No delivery starts now, and none is running when the transports stop (a delivery may
    // cancel in another transport).
    {
      std::unique_lock<std::mutex> lock(mu_);
      closing_ = true;
      open_.clear();
      settling_.clear();
      cv_.wait(lock, [&] { return delivering_.empty(); });
    }
    receivers_.clear();
  }

  // Creates the transports; `this` must not move (their callbacks point at it).
  absl::Status Start(const ReceiverOptions& options, const std::vector<std::string>& names,
                     KvRegionAccess* access) {
    for (size_t i = 0; i < names.size(); ++i) {
      ReceiverOptions o = options;
      o.transport = names[i];
      o.name = endpoint_;
      o.incarnation = incarnation_;
      o.hooks = nullptr;  // metered as a whole
      auto r = CreateReceiver(o, access,
                              [this, i](const CompletedTransfer& done) { OnComplete(i, done); });
      if (!r.ok()) {
        return absl::Status(r.status().code(), absl::StrCat(names[i], ": ", r.status().message()));
      }
      names_.push_back(names[i]);
      receivers_.push_back(*std::move(r));
    }
    return absl::OkStatus();
  }

  std::string endpoint() const override { return endpoint_; }
  uint64_t incarnation() const override { return incarnation_; }

  void Expect(const Expectation& expectation) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_.insert(expectation.transfer_id);
    }
    for (auto& r : receivers_) r->Expect(expectation);
  }

  void Cancel(uint64_t transfer_id, ReleasedCallback released) override {
    {
      // No on_complete follows a Cancel: an outcome being delivered on another thread is
      // waited for (one delivered on this thread, by its own callback, is not; on_complete is
      // short: it posts).
      std::unique_lock<std::mutex> lock(mu_);
      open_.erase(transfer_id);
      settling_.erase(transfer_id);
      cv_.wait(lock, [&] {
        for (const auto& [id, thread] : delivering_) {
          if (id == transfer_id && thread != std::this_thread::get_id()) return false;
        }
        return true;
      });
    }
    // Released once every transport released it.
    auto left = std::make_shared<std::atomic<size_t>>(receivers_.size());
    auto user = std::make_shared<ReleasedCallback>(std::move(released));
    for (auto& r : receivers_) {
      r->Cancel(transfer_id, [this, left, user] {
        if (left->fetch_sub(1) != 1 || !*user) return;
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (closing_) return;
        }
        (*user)();
      });
    }
  }

  int64_t num_in_flight() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(open_.size());
  }

  TransportStats stats() const override {
    TransportStats s;
    for (const auto& r : receivers_) s = Sum(s, r->stats());
    return s;
  }

  absl::StatusOr<std::string> HandleControl(const std::string& request) override {
    const absl::string_view transport = ControlTransportOf(request);
    for (size_t i = 0; i < names_.size(); ++i) {
      if (names_[i] == transport) return receivers_[i]->HandleControl(request);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "kv control: a request of transport '", transport.empty() ? "unknown" : transport,
        "'; this receiver speaks ", absl::StrJoin(names_, ",")));
  }

 private:
  // Transport `i`'s thread: an attempt ended there.
  void OnComplete(size_t i, const CompletedTransfer& done) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (open_.count(done.transfer_id) == 0) return;  // cancelled, or completed elsewhere
      if (done.status.ok()) {
        open_.erase(done.transfer_id);
        settling_.insert(done.transfer_id);
      }
    }
    if (!done.status.ok()) {
      Deliver(done, /*settled=*/false);
      return;
    }
    // The blocks hold the KV now: no other transport may write them any more, so the outcome
    // is delivered once each of them released the transfer (at once, unless one had writes in
    // flight for it).
    auto left = std::make_shared<std::atomic<size_t>>(receivers_.size());
    auto last = [this, left, done] {
      if (left->fetch_sub(1) == 1) Deliver(done, /*settled=*/true);
    };
    for (size_t j = 0; j < receivers_.size(); ++j) {
      if (j != i) receivers_[j]->Cancel(done.transfer_id, last);
    }
    last();
  }

  // Delivers `done` unless it was cancelled meanwhile (`settled`: an OK waiting in settling_).
  void Deliver(const CompletedTransfer& done, bool settled) {
    const auto delivery = std::make_pair(done.transfer_id, std::this_thread::get_id());
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (settled ? settling_.erase(done.transfer_id) == 0 : open_.count(done.transfer_id) == 0) {
        return;
      }
      delivering_.push_back(delivery);
    }
    on_complete_(done);
    {
      std::lock_guard<std::mutex> lock(mu_);
      delivering_.erase(std::find(delivering_.begin(), delivering_.end(), delivery));
    }
    cv_.notify_all();
  }

  const std::string endpoint_;
  const uint64_t incarnation_;
  const CompletionCallback on_complete_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<KvReceiver>> receivers_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_set<uint64_t> open_;  // expected, not yet completed OK nor cancelled
  // Completed OK, delivered once the other transports released the transfer.
  std::unordered_set<uint64_t> settling_;
  bool closing_ = false;
  // Outcomes being delivered (transfer id, delivering thread).
  std::vector<std::pair<uint64_t, std::thread::id>> delivering_;
};

}  // namespace

bool IsMultiTransport(const std::string& transport) {
  return transport.find(',') != std::string::npos;
}

absl::StatusOr<std::unique_ptr<KvSender>> CreateMultiSender(const SenderOptions& options,
                                                            KvRegionAccess* access) {
  auto names = SplitTransports(options.transport);
  if (!names.ok()) return names.status();
  std::vector<std::unique_ptr<KvSender>> senders;
  for (const std::string& name : *names) {
    SenderOptions o = options;
    o.transport = name;
    o.hooks = options.transport_hooks ? options.transport_hooks(name) : options.hooks;
    o.transport_hooks = nullptr;
    auto s = CreateSender(o, access);
    if (!s.ok()) {
      return absl::Status(s.status().code(), absl::StrCat(name, ": ", s.status().message()));
    }
    senders.push_back(*std::move(s));
  }
  return std::make_unique<MultiSender>(*std::move(names), std::move(senders));
}

absl::StatusOr<std::unique_ptr<KvReceiver>> CreateMultiReceiver(
    const ReceiverOptions& options, KvRegionAccess* access,
    KvReceiver::CompletionCallback on_complete) {
  auto names = SplitTransports(options.transport);
  if (!names.ok()) return names.status();
  std::string endpoint =
      options.name.empty() ? absl::StrCat("multi-", getpid(), "-", ++g_names) : options.name;
  auto receiver = std::make_unique<MultiReceiver>(
      std::move(endpoint), options.incarnation != 0 ? options.incarnation : NewIncarnation(),
      std::move(on_complete));
  if (absl::Status st = receiver->Start(options, *names, access); !st.ok()) return st;
  return receiver;
}

}  // namespace tandem::kvtransfer
