#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <mutex>
#include <vector>

#include "router/prefill_leg.h"
#include "router/worker_registry.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

class RequestFlow;

// One Decode stream to one decode worker for some of a flow's samples, plus (for a remote
// prefill) the PrefillLeg that fills the worker's KV reservation. The leg relays the worker's
// tokens and finals to its RequestFlow as they come (their TTFT split comes from the decode
// worker, which learns the prefill worker's part with the KV) and tells the flow when the
// stream is over.
//
// Threads and ownership:
// - The reactor callbacks (OnReadDone, OnDone) run on gRPC threads, one at a time; `message_` is
//   theirs. The Prefill callback runs on another gRPC thread, Cancel on the flow's.
// - `mu_` guards the leg's state: whether the stream ended, whether it was cancelled for a
//   local prefill, whether the decode worker has the KV, and the PrefillLeg. The flow's
//   callbacks run without it.
// - Lifetime: the leg keeps itself (`self_`) from Start until FinishLeg has told the flow; a
//   Prefill call in flight holds a reference of its own.
class DecodeLeg : public grpc::ClientReadReactor<v1::DecodeResponse> {
 public:
  DecodeLeg(std::shared_ptr<RequestFlow> flow, std::shared_ptr<Worker> decode,
            v1::DecodeRequest request, std::vector<int32_t> indices, int64_t load_blocks);
  ~DecodeLeg() override;

  void Start(std::shared_ptr<DecodeLeg> self);
  // Stops the leg: cancels the stream and tells the workers (index < 0: whole leg).
  void Cancel(int32_t local_index);

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

  const std::vector<int32_t>& indices() const { return indices_; }
  // The decode worker.
  const std::shared_ptr<Worker>& worker() const { return decode_; }

 private:
  // Sends the Prefill call for `reservation`; with no prefill worker left, cancels the stream
  // for the decode worker to prefill itself (retry_local_).
  void StartPrefill(const v1::KvReservation& reservation);
  void OnPrefillDone(const grpc::Status& status);
  void FinishLeg(const grpc::Status& status, bool retry_local);
  void SendCancel(const std::shared_ptr<Worker>& worker, int32_t index);

  // Fixed at construction.
  const std::shared_ptr<RequestFlow> flow_;
  const std::shared_ptr<Worker> decode_;
  const v1::DecodeRequest request_;
  const std::vector<int32_t> indices_;  // leg-local sample i is the request's sample indices_[i]
  const int64_t load_blocks_;           // added to the decode worker's load while the leg runs

  grpc::ClientContext context_;  // of the stream; TryCancel from any thread
  v1::DecodeResponse message_;   // the reader's buffer
  // Set by Start; read under mu_ while !ended_; dropped by FinishLeg (after ended_).
  std::shared_ptr<DecodeLeg> self_;

  std::mutex mu_;
  bool ended_ = false;        // OnDone ran: no Prefill call starts any more
  bool retry_local_ = false;  // the stream was cancelled for the decode worker to prefill itself
  bool kv_arrived_ = false;   // the decode worker streamed tokens or a final: it has the KV
  PrefillLeg prefill_;
};

}  // namespace tandem
