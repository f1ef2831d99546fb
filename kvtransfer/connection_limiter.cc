#include "kvtransfer/connection_limiter.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/log.h"

namespace tandem::kvtransfer {

absl::Status ConnectionLimiter::Admit(const std::string& host, int64_t charge, KvRefusal* reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (open_ >= limits_.max_connections) {
    *reason = KvRefusal::kConnectionLimit;
    return absl::ResourceExhaustedError(
        absl::StrCat(open_, " kv connections are open, the most this listener takes"));
  }
  auto it = per_host_.find(host);
  const int from_host = it == per_host_.end() ? 0 : it->second;
  if (from_host >= limits_.max_connections_per_peer) {
    *reason = KvRefusal::kPeerConnectionLimit;
    return absl::ResourceExhaustedError(absl::StrCat(from_host, " kv connections from ", host,
                                                     " are open, the most from one peer"));
  }
  if (!ChargeLocked(charge)) {
    *reason = KvRefusal::kMemory;
    return absl::ResourceExhaustedError("the kv listener's memory budget is spent");
  }
  ++open_;
  ++per_host_[host];
  return absl::OkStatus();
}

void ConnectionLimiter::Leave(const std::string& host, int64_t charge) {
  std::lock_guard<std::mutex> lock(mu_);
  charged_ -= charge;
  --open_;
  auto it = per_host_.find(host);
  if (it != per_host_.end() && --it->second <= 0) per_host_.erase(it);
}

bool ConnectionLimiter::ChargeLocked(int64_t bytes) {
  if (charged_ + bytes > limits_.memory_budget) return false;
  charged_ += bytes;
  peak_ = std::max(peak_, charged_);
  return true;
}

bool ConnectionLimiter::Charge(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return ChargeLocked(bytes);
}

void ConnectionLimiter::Release(int64_t bytes) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  charged_ -= bytes;
}

void ConnectionLimiter::NoteRefused(KvRefusal reason, const std::string& peer,
                                    const absl::Status& why, TransferHooks* hooks) {
  if (hooks != nullptr) hooks->Refused(TransferDirection::kReceive, reason);
  std::lock_guard<std::mutex> lock(mu_);
  ++refused_;
  const absl::Time now = absl::Now();
  if (now - last_refusal_log_ < absl::Seconds(10)) {
    ++refusals_not_logged_;
    return;
  }
  TLOG(WARNING) << "kv transfer: refusing " << peer << " (" << KvRefusalName(reason)
                << "): " << why.message()
                << (refusals_not_logged_ > 0
                        ? absl::StrCat(" (and ", refusals_not_logged_,
                                       " more connections refused since the last such line)")
                        : std::string());
  last_refusal_log_ = now;
  refusals_not_logged_ = 0;
}

uint64_t ConnectionLimiter::refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_;
}

int64_t ConnectionLimiter::charged() const {
  std::lock_guard<std::mutex> lock(mu_);
  return charged_;
}

int64_t ConnectionLimiter::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

int ConnectionLimiter::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

int ConnectionLimiter::open_from(const std::string& host) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = per_host_.find(host);
  return it == per_host_.end() ? 0 : it->second;
}

std::string PeerHost(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

}  // namespace tandem::kvtransfer
