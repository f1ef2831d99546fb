#pragma once

#include <atomic>

#include "decode_worker/worker_core.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

// gRPC service tandem.v1.Worker over a WorkerCore: the router's Decode streams, cancellation
// and stats. Thread-safe.
class WorkerService final : public v1::Worker::CallbackService {
 public:
  explicit WorkerService(WorkerCore* core) : core_(core) {}

  grpc::ServerWriteReactor<v1::DecodeResponse>* Decode(grpc::CallbackServerContext* context,
                                                       const v1::DecodeRequest* request) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const v1::CancelRequest* request,
                                   v1::CancelResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const v1::StatsRequest* request,
                                     v1::WorkerStats* response) override;

  void StartDrain() { draining_.store(true); }
  int64_t active_calls() const { return active_.load(); }

 private:
  friend class DecodeCall;
  WorkerCore* core_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> active_{0};
};

}  // namespace tandem
