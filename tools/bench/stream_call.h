#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tandem/v1/generation.grpc.pb.h"
#include "tools/bench/workload.h"

namespace tandem::bench {

class StreamCall;

using Clock = std::chrono::steady_clock;

// What one Generate stream measured, on the client.
struct CallResult {
  int64_t index = 0;
  int32_t prompt_tokens = 0;
  int32_t max_tokens = 0;
  int32_t output_tokens = 0;
  double start_s = 0;         // since the run's origin
  double ttft_s = -1;         // request sent to first token; -1: no token arrived
  double e2e_s = 0;           // request sent to end of stream
  std::vector<double> itl_s;  // one gap per token after the first (a chunk's gap split evenly)
  bool ok = false;
  bool cancelled = false;  // ended by the client's planned cancellation
  bool cut = false;        // cancelled because the run ended (LiveCall::Cut)
  std::string error;       // "CODE: message" when the stream failed
  bool has_final = false;
  v1::GenerateFinal final;
};

// State of a running call that samplers read from other threads. The caller sets the lengths
// before starting the call; the call only adds to `received`.
struct LiveCall {
  int32_t prompt_tokens = 0;
  int32_t max_tokens = 0;
  std::atomic<int32_t> received{0};

  // Cancels the call at the end of the run (it then counts as cut, not failed). Thread-safe;
  // a no-op once the call has ended. Call it without holding locks that `done` takes: gRPC may
  // run the call's OnDone inline.
  void Cut();

 private:
  friend class StreamCall;
  std::mutex mu_;
  std::weak_ptr<StreamCall> call_;
  bool cut_ = false;
};

struct CallSettings {
  std::string model;
  bool ignore_eos = true;
  float temperature = 0;
  double timeout_s = 600;
  Clock::time_point origin;
  std::atomic<int64_t>* tokens_received = nullptr;  // incremented as tokens arrive (optional)
};

// One Generate stream driven by gRPC's callback API. Start() returns at once; `done` runs
// exactly once, on a gRPC thread, when the stream has ended; the call owns itself until then.
class StreamCall : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  using DoneFn = std::function<void(CallResult)>;
  // `live` (optional) is updated as tokens arrive.
  static void Start(v1::Generation::Stub* stub, const RequestSpec& spec,
                    const CallSettings& settings, std::shared_ptr<LiveCall> live, DoneFn done);

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  friend struct LiveCall;  // Cut() cancels context_
  StreamCall(const RequestSpec& spec, const CallSettings& settings, std::shared_ptr<LiveCall> live,
             DoneFn done);

  CallSettings settings_;
  DoneFn done_;
  int32_t cancel_after_;
  bool cancel_sent_ = false;
  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
  Clock::time_point sent_;
  Clock::time_point last_token_;
  std::shared_ptr<LiveCall> live_;
  std::shared_ptr<StreamCall> self_;  // released in OnDone
  CallResult result_;
};

double SecondsBetween(Clock::time_point a, Clock::time_point b);
// "UNAVAILABLE: message".
std::string StatusText(const grpc::Status& status);

}  // namespace tandem::bench
