#pragma once

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "router/prefill_leg.h"
#include "router/worker_registry.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

class RequestFlow;

// One Decode stream to one decode worker for some of a flow's samples, plus (for a remote
// prefill) the PrefillLeg that fills the worker's KV reservation. The leg relays the worker's
// tokens and finals to its RequestFlow and tells the flow when the stream is over.
//
// A final that arrives while the Prefill call is still out is held until its response (or, at
// most, ClusterOptions::prefill_timings_wait) so that it carries the prefill worker's timings;
// the end of the stream waits for the held finals, so the flow sees every final before the
// leg's end.
//
// Threads and ownership:
// - The reactor callbacks (OnReadDone, OnDone) run on gRPC threads, one at a time; `message_` is
//   theirs. The Prefill callback and the alarm run on other gRPC threads, Cancel on the flow's.
// - `mu_` guards the leg's state: whether the stream ended, the prefill (PrefillLeg and whether
//   its call is out), and the held finals. The flow's callbacks run without it.
// - `alarm_mu_` guards only Set and Cancel of the alarm. They never run under `mu_`: the alarm's
//   callback takes `mu_`. Lock order: `mu_` is never taken under `alarm_mu_`.
// - Lifetime: the leg keeps itself (`self_`) from Start until FinishLeg has told the flow; a
//   Prefill call in flight and an armed alarm each hold a reference of their own.
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
  // Timings of the successful remote prefill, if any (for the final's TTFT split).
  bool PrefillTimings(double* prefill_s, double* transfer_s);

 private:
  // Sends the Prefill call for `reservation`; with no prefill worker left, cancels the stream
  // for the decode worker to prefill itself (retry_local_).
  void StartPrefill(const v1::KvReservation& reservation);
  void OnPrefillDone(const grpc::Status& status);
  // Holds a (non-error) final while the Prefill call is out; false: deliver it now.
  bool HoldFinal(const v1::DecodeResponse& response);
  // Delivers the held finals, then ends the leg if its stream has ended meanwhile.
  void ReleaseFinals();
  // The bound on holding finals passed (fired) or was cancelled.
  void OnAlarm(bool fired);
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
  bool kv_arrived_ = false;   // the decode worker streamed tokens: it has the KV
  bool prefill_in_flight_ = false;  // a Prefill call awaits its response
  PrefillLeg prefill_;
  // Finals held for the Prefill response's timings.
  std::vector<v1::DecodeResponse> held_finals_;
  bool hold_expired_ = false;              // prefill_timings_wait passed: finals are no longer held
  bool releasing_ = false;                 // a thread is delivering held finals
  bool alarm_requested_ = false;           // the bound was armed (at most once per leg)
  std::shared_ptr<DecodeLeg> alarm_keep_;  // keeps the leg until the alarm's callback
  std::optional<grpc::Status> held_end_;   // the stream ended while finals were held

  std::mutex alarm_mu_;
  bool alarm_set_ = false;
  grpc::Alarm alarm_;  // the bound on holding finals
};

}  // namespace tandem
