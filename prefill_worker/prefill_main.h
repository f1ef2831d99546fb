#pragma once

#include <memory>

#include "common/worker/worker_main.h"
#include "prefill_worker/prefill_core.h"

namespace tandem {

// The prefill role of a worker process: a PrefillCore on the process's engine, pushing KV over
// --kv-transport, layer by layer unless --no-layerwise-push, zero-copy on one GPU unless
// --kv-zero-copy off.
class PrefillRole : public WorkerRole {
 public:
  absl::Status Start(const WorkerContext& context) override;
  PrefillHandler* prefill_handler() override { return core_.get(); }

 private:
  std::unique_ptr<PrefillCore> core_;
};

// `tandem prefill`: a prefill worker of a disaggregated cluster. Returns the exit code.
int RunPrefillWorker(int argc, char** argv);

}  // namespace tandem
