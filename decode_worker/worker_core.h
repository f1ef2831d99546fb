#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/engine/async_engine.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

// The engine side of the worker API: turns DecodeRequests into engine requests on an
// AsyncEngine and the engine's updates into DecodeResponses. Used in-process by
// `tandem serve` and behind the gRPC Worker service. Thread-safe.
class WorkerCore {
 public:
  using ResponseCallback = std::function<void(const v1::DecodeResponse&)>;

  explicit WorkerCore(AsyncEngine* engine) : engine_(engine) {}

  // Callbacks run on the engine thread and must not block. A request that fails validation
  // gets one SampleFinal with FINISH_REASON_ERROR, error_code and error_message.
  void Decode(const v1::DecodeRequest& request, ResponseCallback callback);
  void Cancel(const std::string& request_id, int32_t index);
  v1::WorkerStats Stats() const;

 private:
  AsyncEngine* engine_;
};

}  // namespace tandem
