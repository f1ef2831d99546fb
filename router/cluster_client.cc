#include "router/cluster_client.h"

#include "absl/strings/str_cat.h"
#include "router/request_flow.h"

namespace tandem {

ClusterClient::ClusterClient(WorkerRegistry* registry, const ClusterOptions& options)
    : registry_(registry), options_(options) {}

ClusterClient::~ClusterClient() = default;

void ClusterClient::Decode(const v1::DecodeRequest& request, ResponseCallback callback) {
  counters_.requests.fetch_add(1);
  auto flow = std::make_shared<RequestFlow>(static_cast<FlowHost*>(this), request, callback);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!flows_.emplace(request.request_id(), flow).second) flow = nullptr;
  }
  if (flow == nullptr) {
    v1::DecodeResponse r;
    r.mutable_final()->set_finish_reason(v1::FINISH_REASON_ERROR);
    r.mutable_final()->set_error_code(static_cast<int32_t>(grpc::StatusCode::ALREADY_EXISTS));
    r.mutable_final()->set_error_message(
        absl::StrCat("request_id: '", request.request_id(), "' is already running"));
    callback(r);
    return;
  }
  flow->Start();
}

void ClusterClient::Cancel(const std::string& request_id, int32_t index) {
  std::shared_ptr<RequestFlow> flow;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = flows_.find(request_id);
    if (it == flows_.end()) return;
    flow = it->second;
  }
  flow->Cancel(index);
}

void ClusterClient::FlowDone(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  flows_.erase(request_id);
}

RouteChoice ClusterClient::Choose(PlacementRole role, const std::vector<RouteCandidate>& candidates,
                                  int64_t prompt_blocks) {
  return ChooseWorker(options_.routing, candidates, prompt_blocks,
                      role == PlacementRole::kDecode ? &decode_counter_ : &prefill_counter_);
}

void ClusterClient::RecordDecision(const char* reason) {
  if (options_.hooks != nullptr) {
    options_.hooks->RecordRoutingDecision(RoutingPolicyName(options_.routing.policy), reason);
  }
}

void ClusterClient::RecordRetry(const char* role) {
  if (options_.hooks != nullptr) options_.hooks->RecordRetry(role);
}

void ClusterClient::RecordMigration() {
  if (options_.hooks != nullptr) options_.hooks->RecordMigration();
}

int64_t ClusterClient::active_requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(flows_.size());
}

}  // namespace tandem
