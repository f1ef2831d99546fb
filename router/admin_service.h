#pragma once

#include "router/cluster_client.h"
#include "router/worker_registry.h"
#include "tandem/v1/router_admin.grpc.pb.h"

namespace tandem {

// tandem.v1.RouterAdmin: the router's view of its workers and its orchestration counters. Its
// listener lets only keys with the admin scope call it (router/generation_front.cc).
class RouterAdminService final : public v1::RouterAdmin::CallbackService {
 public:
  RouterAdminService(WorkerRegistry* registry, ClusterClient* client)
      : registry_(registry), client_(client) {}

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
  WorkerRegistry* registry_;
  ClusterClient* client_;
};

}  // namespace tandem
