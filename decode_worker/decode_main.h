#pragma once

#include <memory>

#include "common/worker/worker_main.h"
#include "decode_worker/decode_core.h"
#include "kvtransfer/control_rpc/control_rpc.h"

namespace tandem {

// The decode role of a worker process: a DecodeCore on the process's engine, receiving KV over
// --kv-transport on --kv-host:--kv-port (nccl: the control service there, KV over NCCL), advertised
// in GetInfo (kv_endpoint, incarnation).
class DecodeRole : public WorkerRole {
 public:
  absl::Status Start(const WorkerContext& context) override;
  DecodeHandler* decode_handler() override { return core_.get(); }
  void Describe(v1::WorkerInfo* info) const override;

 private:
  std::unique_ptr<DecodeCore> core_;
  // nccl: the control service feeding core_'s receiver; declared after core_ so it stops first.
  std::unique_ptr<kvtransfer::KvControlServer> control_;
};

// `tandem decode`: a decode worker of a disaggregated cluster. Returns the exit code.
int RunDecodeWorker(int argc, char** argv);

}  // namespace tandem
