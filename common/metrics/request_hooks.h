#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/http/http_hooks.h"

namespace tandem {

// How a client request ended, the `outcome` label. Bounded.
enum class RequestOutcome {
  kOk,         // finished with tokens (any finish reason but error)
  kCancelled,  // the client cancelled or went away
  kInvalid,    // rejected as malformed: INVALID_ARGUMENT, NOT_FOUND, OUT_OF_RANGE, ...
  kRejected,   // no capacity or shutting down: RESOURCE_EXHAUSTED, UNAVAILABLE
  kTimeout,    // DEADLINE_EXCEEDED
  kError,      // anything else (INTERNAL, ...)
};
inline constexpr int kNumRequestOutcomes = 6;

inline const char* RequestOutcomeName(RequestOutcome outcome) {
  constexpr const char* kNames[kNumRequestOutcomes] = {"ok",       "cancelled", "invalid",
                                                       "rejected", "timeout",   "error"};
  return kNames[static_cast<int>(outcome)];
}

// The outcome of a call that ended with `code` (absl and gRPC share the numbering).
inline RequestOutcome OutcomeForStatusCode(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return RequestOutcome::kOk;
    case absl::StatusCode::kCancelled:
      return RequestOutcome::kCancelled;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kUnimplemented:
      return RequestOutcome::kInvalid;
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kUnavailable:
      return RequestOutcome::kRejected;
    case absl::StatusCode::kDeadlineExceeded:
      return RequestOutcome::kTimeout;
    default:
      return RequestOutcome::kError;
  }
}

// One client request's progress, as the router sees it (implemented by RequestTracker, which
// measures TTFT, inter-token and end-to-end latency). Not thread-safe: the request's owner
// serialises the calls.
class RequestHooks {
 public:
  virtual ~RequestHooks() = default;
  // The request was accepted (validated, tokenized) with `samples` samples.
  virtual void Start(int32_t samples, int64_t prompt_tokens) = 0;
  // `count` tokens of sample `index` arrived now.
  virtual void OnTokens(int32_t index, int64_t count) = 0;
  // The request ended (first call wins). `finish_reason`: the last finished sample's reason
  // (stop, length, abort, error), empty when none finished.
  virtual void Finish(RequestOutcome outcome, std::string_view finish_reason) = 0;
  // Arrival to first token; zero before it.
  virtual absl::Duration time_to_first_token() const = 0;
};

// Makes RequestHooks (implemented by RouterMetrics). Header-only interface: the router calls it
// without linking the metrics library. Thread-safe.
class RequestHooksFactory {
 public:
  virtual ~RequestHooksFactory() = default;
  virtual std::unique_ptr<RequestHooks> NewRequest(absl::Time arrival) = 0;
  // The HTTP API's transport metrics (connections, refusals, timeouts); null when none.
  virtual HttpHooks* http_hooks() { return nullptr; }
};

// Everything the router reports (implemented by RouterMetrics): per-request hooks plus
// placement, failures and the health of the workers it knows. Thread-safe.
class RouterHooks : public RequestHooksFactory {
 public:
  // `reason`: one of the routing_reason constants (routing_reason.h); keep labels bounded.
  virtual void RecordRoutingDecision(std::string_view policy, std::string_view reason) = 0;
  // A request re-sent after a worker of `role` (prefill or decode) failed or timed out.
  virtual void RecordRetry(std::string_view role) = 0;
  // A running stream moved to another decode worker.
  virtual void RecordMigration() = 0;
  virtual void SetWorkerHealthy(std::string_view worker, std::string_view role, bool healthy) = 0;
  // The worker left discovery: drop its series.
  virtual void RemoveWorker(std::string_view worker, std::string_view role) = 0;
};

// What a worker's gRPC service reports (implemented by WorkerMetrics). Thread-safe.
class WorkerHooks {
 public:
  virtual ~WorkerHooks() = default;
  virtual void StreamStarted() = 0;
  virtual void StreamFinished(RequestOutcome outcome) = 0;
  virtual void SetDraining(bool draining) = 0;
};

}  // namespace tandem
