#pragma once

#include <memory>

#include "common/worker/worker_main.h"
#include "decode_worker/decode_core.h"

namespace tandem {

// The decode role of a worker process: a DecodeCore on the process's engine, receiving KV over
// --kv-transport on --kv-host:--kv-port, advertised in GetInfo (kv_endpoint, incarnation).
class DecodeRole : public WorkerRole {
 public:
  absl::Status Start(const WorkerContext& context) override;
  DecodeHandler* decode_handler() override { return core_.get(); }
  void Describe(v1::WorkerInfo* info) const override;

 private:
  std::unique_ptr<DecodeCore> core_;
};

// `tandem decode`: a decode worker of a disaggregated cluster. Returns the exit code.
int RunDecodeWorker(int argc, char** argv);

}  // namespace tandem
