#include "decode_worker/worker_service.h"

#include <deque>
#include <memory>
#include <mutex>
#include <optional>

namespace tandem {

// One Decode stream. Responses arrive on the engine thread and are queued; only the holder of
// the writer role (writing_) calls StartWrite or Finish, so the reactor outlives every call on
// it (see router/generate_call.h for the same protocol).
class DecodeCall : public grpc::ServerWriteReactor<v1::DecodeResponse> {
 public:
  DecodeCall(WorkerService* service, const v1::DecodeRequest& request)
      : service_(service), request_id_(request.request_id()) {
    service_->active_.fetch_add(1);
  }

  // Starts the request; `self` keeps the call alive for callbacks that outlive OnDone.
  static void Begin(std::shared_ptr<DecodeCall> self, const v1::DecodeRequest& request) {
    self->self_ = self;
    if (self->service_->draining_.load()) {
      std::unique_lock<std::mutex> lock(self->mu_);
      self->status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is shutting down");
      self->PumpLocked(lock);
      return;
    }
    const int32_t n = request.n() == 0 ? 1 : request.n();
    self->open_ = n;
    self->service_->core_->Decode(request,
                                  [self](const v1::DecodeResponse& r) { self->OnResponse(r); });
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok && !status_.has_value()) {
      service_->core_->Cancel(request_id_, -1);
      queue_.clear();
      status_ = grpc::Status(grpc::StatusCode::CANCELLED, "router went away");
    }
    PumpLocked(lock);
  }

  void OnCancel() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (open_ > 0) service_->core_->Cancel(request_id_, -1);
    queue_.clear();
    if (!status_.has_value()) status_ = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    PumpLocked(lock);
  }

  void OnDone() override {
    service_->active_.fetch_sub(1);
    std::shared_ptr<DecodeCall> self;
    std::lock_guard<std::mutex> lock(mu_);
    self.swap(self_);
  }

 private:
  void OnResponse(const v1::DecodeResponse& r) {
    std::unique_lock<std::mutex> lock(mu_);
    if (status_.has_value()) return;
    queue_.push_back(r);
    if (r.has_final()) {
      if (r.final().finish_reason() == v1::FINISH_REASON_ERROR || --open_ <= 0) {
        status_ = grpc::Status::OK;  // errors travel inside SampleFinal
      }
    }
    PumpLocked(lock);
  }

  void PumpLocked(std::unique_lock<std::mutex>& lock) {
    if (writing_ || finish_called_) return;
    if (!queue_.empty()) {
      writing_ = true;
      in_flight_ = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      StartWrite(&in_flight_);
      lock.lock();
      return;
    }
    if (status_.has_value()) {
      finish_called_ = true;
      grpc::Status st = *status_;
      lock.unlock();
      Finish(st);
      lock.lock();
    }
  }

  WorkerService* service_;
  std::string request_id_;
  std::mutex mu_;
  std::deque<v1::DecodeResponse> queue_;
  v1::DecodeResponse in_flight_;
  bool writing_ = false;
  bool finish_called_ = false;
  int32_t open_ = 0;
  std::optional<grpc::Status> status_;
  std::shared_ptr<DecodeCall> self_;
};

grpc::ServerWriteReactor<v1::DecodeResponse>* WorkerService::Decode(
    grpc::CallbackServerContext* context, const v1::DecodeRequest* request) {
  auto call = std::make_shared<DecodeCall>(this, *request);
  DecodeCall::Begin(call, *request);
  return call.get();
}

grpc::ServerUnaryReactor* WorkerService::Cancel(grpc::CallbackServerContext* context,
                                                const v1::CancelRequest* request,
                                                v1::CancelResponse* response) {
  core_->Cancel(request->request_id(), request->index());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* WorkerService::GetStats(grpc::CallbackServerContext* context,
                                                  const v1::StatsRequest* request,
                                                  v1::WorkerStats* response) {
  *response = core_->Stats();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem
