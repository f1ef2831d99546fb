#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "router/flow_host.h"
#include "router/inference_client.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

class DecodeLeg;

// One client request in a disaggregated cluster: one or more legs (Decode streams to decode
// workers, router/decode_leg.h), each covering some of the request's samples. The first leg
// covers all n samples; when a decode worker fails, each unfinished sample continues on a new
// leg elsewhere with the tokens it already produced. Tokens go to the callback in order per
// sample, exactly once.
//
// Threads: Start and Cancel run on the caller's thread, OnResponse and OnLegDone on the legs'
// gRPC callback threads. `mu_` guards the state below it; the callback, the host and the legs
// are called without it held.
class RequestFlow : public std::enable_shared_from_this<RequestFlow> {
 public:
  // `host` (the ClusterClient) outlives the flow.
  RequestFlow(FlowHost* host, const v1::DecodeRequest& request,
              InferenceClient::ResponseCallback callback);

  void Start();
  void Cancel(int32_t index);

  // From legs (gRPC callback threads).
  void OnResponse(DecodeLeg* leg, const v1::DecodeResponse& response);
  void OnLegDone(DecodeLeg* leg, const grpc::Status& status, bool retry_local);

  FlowHost* host() const { return host_; }

 private:
  struct Sample {
    std::vector<int32_t> delivered;
    bool finished = false;
  };
  // Starts a leg for `indices` (all samples: the original request; one sample: n = 1 with its
  // tokens so far). Returns false when no decode worker is available.
  bool StartLeg(const std::vector<int32_t>& indices, const std::vector<Worker*>& exclude,
                bool force_local);
  // The next leg's request, for `indices`: the client's request, or for a single continuing
  // sample n = 1 with its seed and the tokens it already streamed; each later leg gets its own
  // request id. Counts the leg. Requires mu_.
  v1::DecodeRequest NextLegRequestLocked(const std::vector<int32_t>& indices);
  void FinishWithError(const std::vector<int32_t>& indices, grpc::StatusCode code,
                       const std::string& message);
  void MaybeDone();

  FlowHost* const host_;
  const v1::DecodeRequest request_;
  const InferenceClient::ResponseCallback callback_;

  std::mutex mu_;
  std::vector<Sample> samples_;                   // by the request's sample index
  std::vector<std::shared_ptr<DecodeLeg>> legs_;  // the legs not yet done
  int migrations_ = 0;
  int leg_counter_ = 0;     // legs started so far (names the ids of later legs)
  bool cancelled_ = false;  // the whole request was cancelled
  bool done_ = false;       // every sample finished and every leg done: FlowDone was called
};

}  // namespace tandem
