#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

// Role handlers behind the Worker gRPC service (and behind in-process clients).

// Decode role (also the monolithic "both" role): generates tokens.
class DecodeHandler {
 public:
  // Responses of one request, in order, on a thread of the handler's choosing (never blocking).
  // A rejected request gets one SampleFinal with FINISH_REASON_ERROR.
  using ResponseCallback = std::function<void(const v1::DecodeResponse&)>;
  virtual ~DecodeHandler() = default;
  virtual void Decode(const v1::DecodeRequest& request, ResponseCallback callback) = 0;
  // index < 0: the whole request.
  virtual void Cancel(const std::string& request_id, int32_t index) = 0;
  // Reservations waiting for KV plus transfers being received.
  virtual int64_t transfers_in_flight() const { return 0; }
};

// Prefill role: computes prompts and pushes their KV to decode workers.
class PrefillHandler {
 public:
  using DoneCallback = std::function<void(const absl::Status&, const v1::PrefillResponse&)>;
  virtual ~PrefillHandler() = default;
  virtual void Prefill(const v1::PrefillRequest& request, DoneCallback done) = 0;
  virtual void Cancel(const std::string& request_id) = 0;
  virtual int64_t transfers_in_flight() const { return 0; }
};

}  // namespace tandem
