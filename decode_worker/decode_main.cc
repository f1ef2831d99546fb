#include "decode_worker/decode_main.h"

#include "absl/strings/str_cat.h"

namespace tandem {

absl::Status DecodeRole::Start(const WorkerContext& context) {
  core_ = std::make_unique<DecodeCore>(context.engine);
  kvtransfer::ReceiverOptions ro = context.flags->kv;  // transport, host, port
  ro.layout = context.layout;
  ro.secret = context.kv_secret;
  ro.hooks = context.transfer_hooks;
  ro.cuda_device = context.cuda_device;
  if (kvtransfer::UsesControlChannel(ro.transport)) {
    // The KV endpoint is the control service's address; the secret guards its messages (the
    // nccl and cuda-ipc data paths have no handshake of their own to carry it).
    kvtransfer::KvControlLimits limits;
    limits.max_connections = ro.limits.max_connections;
    limits.max_connections_per_peer = ro.limits.max_connections_per_peer;
    limits.handshake_timeout = ro.handshake_timeout;
    auto control = kvtransfer::KvControlServer::Start(ro.host, ro.port, context.flags->server.tls,
                                                      context.kv_secret, absl::Seconds(60), limits,
                                                      context.transfer_hooks);
    if (!control.ok()) {
      return absl::Status(control.status().code(),
                          absl::StrCat("KV control service: ", control.status().message()));
    }
    control_ = *std::move(control);
    ro.name = kvtransfer::AdvertisedEndpoint(ro.host, ro.advertise_host, control_->port());
    ro.secret.clear();
  }
  if (absl::Status st = core_->StartReceiver(ro, context.regions); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("KV receiver: ", st.message()));
  }
  if (control_ != nullptr) control_->SetReceiver(core_->receiver());
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
