#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "router/flow_host.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

// The Prefill calls for one decode leg's KV reservation: picks a prefill worker by the routing
// policy, sends it the leg's prompt with the reservation as its target, and after a failed call
// sends the next attempt, with the same reservation, to a prefill worker not tried yet (the
// decode worker keeps the reservation meanwhile). At most one call is out at a time.
//
// Not thread-safe: its DecodeLeg owns it and calls it only under the leg's mutex.
class PrefillLeg {
 public:
  // `request` (the leg's Decode request) and `decode` (its decode worker, never a prefill
  // target) outlive this.
  PrefillLeg(FlowHost* host, const v1::DecodeRequest* request, const Worker* decode);
  ~PrefillLeg();

  using DoneCallback = std::function<void(const grpc::Status&)>;
  // Sends the current attempt for `reservation` to a prefill worker; `done` runs on a gRPC
  // thread with the call's status, after which CallEnded must be called. Returns false when no
  // prefill worker is left to try (reported as a no_worker decision).
  bool Send(const v1::KvReservation& reservation, DoneCallback done);
  // The call answered with `status`: its worker's load estimate drops.
  void CallEnded(const grpc::Status& status);
  // After a failed call: reports the worker (when unreachable), never tries it again for this
  // reservation and counts the retry. Returns whether another attempt is allowed
  // (ClusterOptions::max_prefill_attempts); then Send(reservation()) makes it.
  bool Failed(const grpc::Status& status);
  // Cancels the call in flight, if any.
  void CancelCall();

  const v1::KvReservation& reservation() const { return reservation_; }
  // The worker of the latest call (null before the first).
  const std::shared_ptr<Worker>& worker() const { return worker_; }

 private:
  FlowHost* const host_;
  const v1::DecodeRequest* const request_;
  const Worker* const decode_;

  v1::KvReservation reservation_;
  uint32_t attempt_ = 0;
  std::shared_ptr<Worker> worker_;
  std::vector<Worker*> failed_;  // workers whose call failed: not tried again
  // The latest call; gRPC uses these until `done` runs.
  std::unique_ptr<grpc::ClientContext> context_;
  v1::PrefillRequest call_request_;
  v1::PrefillResponse response_;
};

}  // namespace tandem
