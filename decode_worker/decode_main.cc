#include "decode_worker/decode_main.h"

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status DecodeRole::Start(const WorkerContext& context) {
  core_ = std::make_unique<DecodeCore>(context.engine);
  kvtransfer::ReceiverOptions ro = context.flags->kv;  // transport, host, port
  ro.layout = context.layout;
  ro.secret = context.kv_secret;
  ro.hooks = context.transfer_hooks;
  if (absl::Status st = core_->StartReceiver(ro, context.regions); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("KV receiver: ", st.message()));
  }
  return absl::OkStatus();
}

void DecodeRole::Describe(v1::WorkerInfo* info) const {
  info->set_kv_endpoint(core_->kv_endpoint());
  info->set_incarnation(core_->incarnation());
}

int RunDecodeWorker(int argc, char** argv) {
  return RunSingleRoleWorker<DecodeRole>(argc, argv, "decode");
}

}  // namespace tandem
