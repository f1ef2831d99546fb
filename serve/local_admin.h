#pragma once

#include <functional>

#include "tandem/v1/router_admin.grpc.pb.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {

// tandem.v1.RouterAdmin of `tandem serve` without workers: its one in-process worker (role both)
// with live load, in place of the Worker API, which that port does not offer. Admin-scoped like
// the router's (router/generation_front.cc).
class LocalAdminService final : public v1::RouterAdmin::CallbackService {
 public:
  explicit LocalAdminService(std::function<v1::WorkerStats()> stats) : stats_(std::move(stats)) {}

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

 private:
  std::function<v1::WorkerStats()> stats_;
};

}  // namespace tandem
