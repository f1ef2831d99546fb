#include "router/http/generate_stream.h"

namespace tandem {

GenerateStream::GenerateStream(v1::Generation::Stub* stub, const v1::GenerateRequest& request,
                               const std::vector<std::pair<std::string, std::string>>& metadata)
    : request_(request) {
  for (const auto& [key, value] : metadata) context_.AddMetadata(key, value);
  stub->async()->Generate(&context_, &request_, this);
  StartRead(&in_);
  StartCall();
}

GenerateStream::~GenerateStream() {
  context_.TryCancel();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return status_.has_value(); });
}

void GenerateStream::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(in_));
  }
  cv_.notify_all();
  in_.Clear();
  StartRead(&in_);
}

void GenerateStream::OnDone(const grpc::Status& status) {
  // Notified under the lock: the destructor may run as soon as it sees status_.
  std::lock_guard<std::mutex> lock(mu_);
  status_ = status;
  cv_.notify_all();
}

GenerateStream::Next GenerateStream::Wait(absl::Duration timeout, v1::GenerateResponse* message) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool ready = cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                                  [this] { return !queue_.empty() || status_.has_value(); });
  if (!ready) return Next::kTimeout;
  if (!queue_.empty()) {
    *message = std::move(queue_.front());
    queue_.pop_front();
    return Next::kMessage;
  }
  return Next::kDone;
}

grpc::Status GenerateStream::status() {
  std::lock_guard<std::mutex> lock(mu_);
  return status_.value_or(grpc::Status(grpc::StatusCode::UNKNOWN, "still running"));
}

}  // namespace tandem
