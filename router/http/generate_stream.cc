#include "router/http/generate_stream.h"

namespace tandem {

std::shared_ptr<GenerateStream> GenerateStream::Start(
    v1::Generation::Stub* stub, const v1::GenerateRequest& request,
    const std::vector<std::pair<std::string, std::string>>& metadata,
    std::function<void()> notify) {
  std::shared_ptr<GenerateStream> s(new GenerateStream(request, std::move(notify)));
  s->self_ = s;
  for (const auto& [key, value] : metadata) s->context_.AddMetadata(key, value);
  stub->async()->Generate(&s->context_, &s->request_, s.get());
  s->StartRead(&s->in_);
  s->StartCall();
  return s;
}

void GenerateStream::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(in_));
  }
  in_.Clear();
  StartRead(&in_);
  notify_();
}

void GenerateStream::OnDone(const grpc::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
  }
  notify_();
  // The last callback: the reactor may go now (when nobody else holds it).
  std::shared_ptr<GenerateStream> keep = std::move(self_);
}

GenerateStream::Next GenerateStream::Poll(v1::GenerateResponse* message) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!queue_.empty()) {
    *message = std::move(queue_.front());
    queue_.pop_front();
    return Next::kMessage;
  }
  return status_.has_value() ? Next::kDone : Next::kNone;
}

grpc::Status GenerateStream::status() {
  std::lock_guard<std::mutex> lock(mu_);
  return status_.value_or(grpc::Status(grpc::StatusCode::UNKNOWN, "still running"));
}

}  // namespace tandem
