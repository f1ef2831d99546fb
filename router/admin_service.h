#pragma once

#include <functional>

#include "router/cluster_client.h"
#include "router/lora_catalog.h"
#include "router/worker_registry.h"
#include "tandem/v1/router_admin.grpc.pb.h"

namespace tandem {

// tandem.v1.RouterAdmin: the router's view of its workers and its orchestration counters. Its
// listener lets only keys with the admin scope call it (router/generation_front.cc). Runtime LoRA
// loading goes to `lora` (the cluster's catalog) after `admin` accepts the call: the HTTP API's
// calls come through an in-process channel the listener's policy never sees, so the scope is
// checked here too.
class RouterAdminService final : public v1::RouterAdmin::CallbackService {
 public:
  using AdminCheck = std::function<grpc::Status(const grpc::CallbackServerContext& context)>;
  RouterAdminService(WorkerRegistry* registry, ClusterClient* client, LoraCatalog* lora = nullptr,
                     AdminCheck admin = nullptr)
      : registry_(registry), client_(client), lora_(lora), admin_(std::move(admin)) {}

  grpc::ServerUnaryReactor* LoadLoraAdapter(grpc::CallbackServerContext* context,
                                            const v1::LoadLoraAdapterRequest* request,
                                            v1::LoraAdapterResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (admin_) {
      if (grpc::Status st = admin_(*context); !st.ok()) {
        reactor->Finish(st);
        return reactor;
      }
    }
    absl::Status st =
        lora_ == nullptr ? NoLora() : lora_->Load(request->lora_name(), request->lora_path());
    reactor->Finish(ToGrpc(st));
    return reactor;
  }

  grpc::ServerUnaryReactor* UnloadLoraAdapter(grpc::CallbackServerContext* context,
                                              const v1::UnloadLoraAdapterRequest* request,
                                              v1::LoraAdapterResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (admin_) {
      if (grpc::Status st = admin_(*context); !st.ok()) {
        reactor->Finish(st);
        return reactor;
      }
    }
    absl::Status st = NoLora();
    if (lora_ != nullptr) {
      auto in_use = lora_->Unload(request->lora_name());
      st = in_use.status();
      if (in_use.ok()) response->set_in_use(*in_use);
    }
    reactor->Finish(ToGrpc(st));
    return reactor;
  }

  grpc::ServerUnaryReactor* GetClusterStatus(grpc::CallbackServerContext* context,
                                             const v1::ClusterStatusRequest* request,
                                             v1::ClusterStatus* response) override {
    for (const auto& w : registry_->All()) {
      v1::WorkerStatus* s = response->add_workers();
      s->set_address(w->address);
      s->set_role(w->info.role());
      s->set_healthy(w->healthy.load());
      s->set_incarnation(w->info.incarnation());
      s->set_routed_requests(w->routed_requests.load());
      s->set_inflight_requests(w->inflight_requests.load());
      std::lock_guard<std::mutex> lock(w->mu);
      s->set_cached_blocks(static_cast<int64_t>(w->cached.size()));
      s->set_kv_blocks_used(w->stats.kv_blocks_used());
      *s->mutable_stats() = w->stats;
    }
    for (const auto& r : registry_->refused()) response->add_refused(r);
    const ClusterCounters& c = client_->counters();
    response->set_requests(c.requests.load());
    response->set_remote_prefills(c.remote_prefills.load());
    response->set_local_prefills(c.local_prefills.load());
    response->set_prefill_retries(c.prefill_retries.load());
    response->set_migrations(c.migrations.load());
    response->set_failures(c.failures.load());
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  static absl::Status NoLora() {
    return absl::FailedPreconditionError("LoRA is not enabled (--enable-lora)");
  }
  static grpc::Status ToGrpc(const absl::Status& st) {
    return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
  }

  WorkerRegistry* registry_;
  ClusterClient* client_;
  LoraCatalog* lora_;
  AdminCheck admin_;
};

}  // namespace tandem
