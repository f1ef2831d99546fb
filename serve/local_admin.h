#pragma once

#include <functional>

#include "router/lora_catalog.h"
#include "tandem/v1/router_admin.grpc.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

// tandem.v1.RouterAdmin of `tandem serve` without workers: its one in-process worker (role both)
// with live load, in place of the Worker API, which that port does not offer. Admin-scoped like
// the router's (router/generation_front.cc). Runtime LoRA loading goes to `lora` (null: LoRA is
// off, FAILED_PRECONDITION) after `admin` accepts the call: the listener's policy does not see
// the HTTP API's calls, which come through an in-process channel, so the scope is checked here.
class LocalAdminService final : public v1::RouterAdmin::CallbackService {
 public:
  using AdminCheck = std::function<grpc::Status(const grpc::CallbackServerContext& context)>;
  LocalAdminService(std::function<v1::WorkerStats()> stats, LoraCatalog* lora, AdminCheck admin)
      : stats_(std::move(stats)), lora_(lora), admin_(std::move(admin)) {}

  grpc::ServerUnaryReactor* GetClusterStatus(grpc::CallbackServerContext* context,
                                             const v1::ClusterStatusRequest* request,
                                             v1::ClusterStatus* response) override {
    v1::WorkerStatus* s = response->add_workers();
    s->set_address("in-process");
    s->set_role("both");
    s->set_healthy(true);
    *s->mutable_stats() = stats_();
    s->set_kv_blocks_used(s->stats().kv_blocks_used());
    s->set_cached_blocks(s->stats().kv_blocks_cached());
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* LoadLoraAdapter(grpc::CallbackServerContext* context,
                                            const v1::LoadLoraAdapterRequest* request,
                                            v1::LoraAdapterResponse* response) override {
    if (grpc::Status st = admin_(*context); !st.ok()) return Finish(context, st);
    absl::Status st =
        lora_ == nullptr ? NoLora() : lora_->Load(request->lora_name(), request->lora_path());
    return Finish(context, ToGrpc(st));
  }

  grpc::ServerUnaryReactor* UnloadLoraAdapter(grpc::CallbackServerContext* context,
                                              const v1::UnloadLoraAdapterRequest* request,
                                              v1::LoraAdapterResponse* response) override {
    if (grpc::Status st = admin_(*context); !st.ok()) return Finish(context, st);
    absl::Status st = NoLora();
    if (lora_ != nullptr) {
      auto in_use = lora_->Unload(request->lora_name());
      st = in_use.status();
      if (in_use.ok()) response->set_in_use(*in_use);
    }
    return Finish(context, ToGrpc(st));
  }

 private:
  static absl::Status NoLora() {
    return absl::FailedPreconditionError("LoRA is not enabled (--enable-lora)");
  }
  static grpc::Status ToGrpc(const absl::Status& st) {
    return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
  }
  static grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context,
                                          const grpc::Status& st) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(st);
    return reactor;
  }

  std::function<v1::WorkerStats()> stats_;
  LoraCatalog* lora_;
  AdminCheck admin_;
};

}  // namespace tandem
