#pragma once

// Helpers for kvtransfer tests: a fake KV pool over a std::vector with guard bytes around every
// region, completion collectors, and a one-call transfer.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "kvtransfer/transfer_hooks.h"
#include "kvtransfer/transport.h"
#include "tests/unit/common/cluster/kv_layout_test_util.h"

namespace tandem::kvtransfer::testing {

inline constexpr uint8_t kGuardByte = 0xa5;

// 4 layers, regions of 256 bytes.
inline KvLayout SmallLayout() { return tandem::testing::SmallKvLayout(); }

// [guard][region (layer 0, block 0)][guard][region (0, 1)] ... [guard]
class FakePool : public KvRegionAccess {
 public:
  FakePool(const KvLayout& layout, int64_t num_blocks, size_t guard = 32)
      : layout_(layout),
        num_blocks_(num_blocks),
        region_(layout.region_bytes()),
        guard_(guard),
        bytes_(guard + static_cast<size_t>(layout.num_layers * num_blocks) * (region_ + guard),
               kGuardByte) {
    Zero();
  }

  uint8_t* Region(int64_t layer, int32_t block) override {
    return bytes_.data() + Offset(layer, block);
  }
  int64_t num_blocks() const override { return num_blocks_; }
  size_t region_bytes() const { return region_; }

  // Deterministic, distinct contents for every (layer, block, byte).
  void Fill(uint64_t seed) {
    for (int64_t l = 0; l < layout_.num_layers; ++l) {
      for (int32_t b = 0; b < num_blocks_; ++b) {
        uint64_t x = seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(l * num_blocks_ + b);
        uint8_t* r = Region(l, b);
        for (size_t i = 0; i < region_; ++i) {
          x ^= x << 13;
          x ^= x >> 7;
          x ^= x << 17;
          r[i] = static_cast<uint8_t>(x);
        }
      }
    }
  }
  void Zero() {
    for (int64_t l = 0; l < layout_.num_layers; ++l) {
      for (int32_t b = 0; b < num_blocks_; ++b) std::memset(Region(l, b), 0, region_);
    }
  }
  bool IsZero(int64_t layer, int32_t block) {
    const uint8_t* r = Region(layer, block);
    for (size_t i = 0; i < region_; ++i) {
      if (r[i] != 0) return false;
    }
    return true;
  }
  bool GuardsIntact() const {
    for (int64_t l = 0; l < layout_.num_layers; ++l) {
      for (int32_t b = 0; b < num_blocks_; ++b) {
        const size_t start = Offset(l, b) - guard_;
        for (size_t i = 0; i < guard_; ++i) {
          if (bytes_[start + i] != kGuardByte) return false;
        }
      }
    }
    for (size_t i = bytes_.size() - guard_; i < bytes_.size(); ++i) {
      if (bytes_[i] != kGuardByte) return false;
    }
    return true;
  }

 private:
  size_t Offset(int64_t layer, int32_t block) const {
    return guard_ + static_cast<size_t>(layer * num_blocks_ + block) * (region_ + guard_);
  }

  KvLayout layout_;
  int64_t num_blocks_;
  size_t region_;
  size_t guard_;
  std::vector<uint8_t> bytes_;
};

inline bool SameRegion(FakePool& a, int64_t layer, int32_t block_a, FakePool& b, int32_t block_b) {
  return std::memcmp(a.Region(layer, block_a), b.Region(layer, block_b), a.region_bytes()) == 0;
}

// Collects on_complete calls.
class Completions {
 public:
  KvReceiver::CompletionCallback Callback() {
    return [this](const CompletedTransfer& c) {
      std::lock_guard<std::mutex> lock(mu_);
      all_.push_back(c);
      cv_.notify_all();
    };
  }
  // The outcome of (transfer_id, attempt), waiting up to `timeout`; UNKNOWN "timeout" if none.
  CompletedTransfer WaitFor(uint64_t transfer_id, uint32_t attempt,
                            absl::Duration timeout = absl::Seconds(10)) {
    std::unique_lock<std::mutex> lock(mu_);
    CompletedTransfer found;
    bool ok = cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout), [&] {
      for (const auto& c : all_) {
        if (c.transfer_id == transfer_id && c.attempt == attempt) {
          found = c;
          return true;
        }
      }
      return false;
    });
    if (!ok) {
      found.transfer_id = transfer_id;
      found.status = absl::UnknownError("timed out waiting for on_complete");
    }
    return found;
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return all_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<CompletedTransfer> all_;
};

// A done callback and the future it completes.
struct Done {
  std::shared_ptr<std::promise<absl::Status>> promise =
      std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> future = promise->get_future();
  KvSender::DoneCallback Callback() {
    return [p = promise](absl::Status s) { p->set_value(std::move(s)); };
  }
  // UNKNOWN "timeout" when the callback did not run in time.
  absl::Status Wait(absl::Duration timeout = absl::Seconds(10)) {
    if (future.wait_for(absl::ToChronoMilliseconds(timeout)) != std::future_status::ready) {
      return absl::UnknownError("timed out waiting for done");
    }
    return future.get();
  }
};

inline std::vector<int32_t> Range(int32_t first, int32_t n) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

// Begin, every layer, Finish; the sender's outcome.
inline absl::Status SendAll(KvSender* sender, const TransferTarget& target,
                            const std::vector<int32_t>& src, int64_t num_layers,
                            const std::string& trailer = "") {
  absl::StatusOr<TransferHandle> h = sender->Begin(target, src);
  if (!h.ok()) return h.status();
  for (int64_t l = 0; l < num_layers; ++l) sender->SendLayer(*h, l);
  Done done;
  sender->Finish(*h, trailer, done.Callback());
  return done.Wait();
}

// What the metrics hooks hear of control messages, per transfer.
class ControlCounts : public TransferHooks {
 public:
  void TransferStarted(TransferDirection) override {}
  void TransferSucceeded(TransferDirection, double, int64_t, int64_t) override {}
  void TransferFailed(TransferDirection, TransferFailure) override {}
  void ControlMessages(int64_t to_receiver, int64_t to_sender) override {
    std::lock_guard<std::mutex> lock(mu_);
    counts_.push_back({to_receiver, to_sender});
  }
  std::vector<std::pair<int64_t, int64_t>> counts() {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_;
  }
  // The counts once `n` transfers reported theirs (5 s at most): a sender reports a transfer's
  // count as it ends, which may follow the transfer's result.
  std::vector<std::pair<int64_t, int64_t>> WaitForCounts(size_t n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (counts().size() < n && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(2));
    return counts();
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<int64_t, int64_t>> counts_;
};

// A KvReceiver::Cancel's `released`: when (and how often) it ran.
class ReleaseProbe {
 public:
  KvReceiver::ReleasedCallback Callback() {
    return [this] {
      std::lock_guard<std::mutex> lock(mu_);
      ++calls_;
      cv_.notify_all();
    };
  }
  int calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  bool WaitFor(absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoMicroseconds(timeout), [&] { return calls_ > 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int calls_ = 0;
};

// Polls `pred` until true or `timeout`.
template <typename Pred>
bool Eventually(Pred pred, absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return pred();
}

}  // namespace tandem::kvtransfer::testing
