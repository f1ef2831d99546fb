#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "tandem/v1/worker.pb.h"

namespace tandem {

// Where the router sends a request to be generated: a worker in this process (`tandem serve`)
// or a remote decode worker over gRPC. Speaks the worker API's messages so the router links no
// engine code.
class InferenceClient {
 public:
  // Responses of one request arrive in order, one at a time, on a thread of the client's
  // choosing; the callback must not block. Exactly one SampleFinal per sample ends the request
  // (or one SampleFinal with an error for a rejected request).
  using ResponseCallback = std::function<void(const v1::DecodeResponse&)>;

  virtual ~InferenceClient() = default;
  virtual void Decode(const v1::DecodeRequest& request, ResponseCallback callback) = 0;
  // Stops sample `index` (or the whole request when index < 0). Its final still arrives.
  virtual void Cancel(const std::string& request_id, int32_t index) = 0;
};

}  // namespace tandem
