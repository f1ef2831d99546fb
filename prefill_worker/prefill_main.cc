#include "prefill_worker/prefill_main.h"

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status PrefillRole::Start(const WorkerContext& context) {
  const WorkerFlags& flags = *context.flags;
  core_ =
      std::make_unique<PrefillCore>(context.engine, context.block_size, !flags.no_layerwise_push);
  kvtransfer::SenderOptions so;
  so.transport = flags.kv.transport;
  so.layout = context.layout;
  so.secret = context.kv_secret;
  so.hooks = context.transfer_hooks;
  if (absl::Status st = core_->StartSender(so, context.regions); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("KV sender: ", st.message()));
  }
  return absl::OkStatus();
}

int RunPrefillWorker(int argc, char** argv) {
  return RunSingleRoleWorker<PrefillRole>(argc, argv, "prefill");
}

}  // namespace tandem
