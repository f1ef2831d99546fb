#pragma once

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "router/cluster_client.h"

namespace tandem {

class DecodeLeg;

// One client request in a disaggregated cluster: one or more legs (Decode streams to decode
// workers), each covering some of the request's samples. The first leg covers all n samples;
// when a decode worker fails, each unfinished sample continues on a new leg elsewhere with the
// tokens it already produced. Tokens go to the callback in order per sample, exactly once.
class RequestFlow : public std::enable_shared_from_this<RequestFlow> {
 public:
  RequestFlow(ClusterClient* client, const v1::DecodeRequest& request,
              InferenceClient::ResponseCallback callback);

  void Start();
  void Cancel(int32_t index);

  // From legs (gRPC callback threads).
  void OnResponse(DecodeLeg* leg, const v1::DecodeResponse& response);
  void OnLegDone(DecodeLeg* leg, const grpc::Status& status, bool retry_local);

  ClusterClient* client() const { return client_; }
  const v1::DecodeRequest& request() const { return request_; }

 private:
  struct Sample {
    std::vector<int32_t> delivered;
    bool finished = false;
  };
  // Starts a leg for `indices` (all samples: the original request; one sample: n = 1 with its
  // tokens so far). Returns false when no decode worker is available.
  bool StartLeg(const std::vector<int32_t>& indices, const std::vector<Worker*>& exclude,
                bool force_local);
  void FinishWithError(const std::vector<int32_t>& indices, grpc::StatusCode code,
                       const std::string& message);
  void MaybeDone();

  ClusterClient* client_;
  v1::DecodeRequest request_;
  InferenceClient::ResponseCallback callback_;
  std::mutex mu_;
  std::vector<Sample> samples_;
  std::vector<std::shared_ptr<DecodeLeg>> legs_;
  int migrations_ = 0;
  int leg_counter_ = 0;
  bool cancelled_ = false;
  bool done_ = false;
};

// One Decode stream to one decode worker, plus the prefill calls for its reservation. A final
// that arrives while the Prefill call is still out is held until its response (or, at most,
// ClusterOptions::prefill_timings_wait) so that it carries the prefill worker's timings; the end
// of the stream waits for the held finals, so the flow sees every final before the leg's end.
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
  const v1::DecodeRequest& request() const { return request_; }
  Worker* worker() const { return decode_.get(); }
  const std::shared_ptr<Worker>& worker_ptr() const { return decode_; }
  // Timings of the successful remote prefill, if any (for the final's TTFT split).
  bool PrefillTimings(double* prefill_s, double* transfer_s);

 private:
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

  std::shared_ptr<RequestFlow> flow_;
  std::shared_ptr<Worker> decode_;
  v1::DecodeRequest request_;
  std::vector<int32_t> indices_;  // leg-local sample i is the request's sample indices_[i]
  int64_t load_blocks_;
  grpc::ClientContext context_;
  v1::DecodeResponse message_;
  std::shared_ptr<DecodeLeg> self_;

  std::mutex mu_;  // prefill state
  bool ended_ = false;
  bool retry_local_ = false;
  v1::KvReservation reservation_;
  uint32_t attempt_ = 0;
  std::shared_ptr<Worker> prefill_;
  std::vector<Worker*> failed_prefill_;
  std::unique_ptr<grpc::ClientContext> prefill_context_;
  v1::PrefillRequest prefill_request_;
  v1::PrefillResponse prefill_response_;
  bool prefill_ok_ = false;
  bool prefill_in_flight_ = false;  // a Prefill call awaits its response
  bool kv_arrived_ = false;         // the decode worker streamed tokens: it has the KV
  std::vector<v1::DecodeResponse> held_finals_;
  bool hold_expired_ = false;  // prefill_timings_wait passed: finals are no longer held
  bool releasing_ = false;     // a thread is delivering held finals
  bool alarm_requested_ = false;
  std::shared_ptr<DecodeLeg> alarm_keep_;  // keeps the leg until the alarm's callback
  bool finish_held_ = false;               // the stream ended while finals were held
  grpc::Status finish_status_;
  std::mutex alarm_mu_;  // Set and Cancel of alarm_
  bool alarm_set_ = false;
  grpc::Alarm alarm_;  // the bound on holding finals
};

}  // namespace tandem
