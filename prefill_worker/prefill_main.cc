#include "prefill_worker/prefill_main.h"

#include "absl/strings/str_cat.h"
#include "kvtransfer/control_rpc/control_rpc.h"

namespace tandem {

absl::Status PrefillRole::Start(const WorkerContext& context) {
  const WorkerFlags& flags = *context.flags;
  absl::StatusOr<bool> zero_copy = ParseKvZeroCopy(flags.kv_zero_copy);
  if (!zero_copy.ok()) return zero_copy.status();
  core_ = std::make_unique<PrefillCore>(context.engine, context.block_size,
                                        !flags.no_layerwise_push, *zero_copy);
  kvtransfer::SenderOptions so;
  so.transport = flags.kv.transport;
  so.layout = context.layout;
  so.secret = context.kv_secret;
  so.hooks = context.transfer_hooks;
  so.transport_hooks = context.transport_hooks;
  so.cuda_device = context.cuda_device;
  if (kvtransfer::UsesControlChannel(so.transport)) {
    // Control messages go to the decode worker's KvControl service, with the process's TLS and
    // the secret proving each one (the nccl data path has no handshake of its own).
    auto channel = kvtransfer::MakeGrpcControlChannel(flags.server.tls, context.kv_secret);
    if (!channel.ok()) {
      return absl::Status(channel.status().code(),
                          absl::StrCat("KV control channel: ", channel.status().message()));
    }
    so.control_channel = *std::move(channel);
    so.secret.clear();
  }
  if (absl::Status st = core_->StartSender(so, context.regions); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("KV sender: ", st.message()));
  }
  return absl::OkStatus();
}

int RunPrefillWorker(int argc, char** argv) {
  return RunSingleRoleWorker<PrefillRole>(argc, argv, "prefill");
}

}  // namespace tandem
