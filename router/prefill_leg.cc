#include "router/prefill_leg.h"

#include <algorithm>

#include "common/base/log.h"
#include "common/cluster/proto/cluster_proto.h"
#include "common/cluster/transfer_key.h"
#include "router/cluster_client.h"
#include "router/lora_routing.h"
#include "router/placement.h"
#include "router/worker_registry.h"

namespace tandem {

PrefillLeg::PrefillLeg(FlowHost* host, const v1::DecodeRequest* request, const Worker* decode)
    : host_(host), request_(request), decode_(decode) {}

PrefillLeg::~PrefillLeg() = default;

bool PrefillLeg::Send(const v1::KvReservation& reservation, DoneCallback done) {
  const ClusterOptions& o = host_->options();
  reservation_ = reservation;
  std::vector<std::shared_ptr<Worker>> prefillers;
  for (auto& w : host_->registry().Healthy("prefill")) {
    if (w.get() == decode_) continue;
    if (std::find(failed_.begin(), failed_.end(), w.get()) != failed_.end()) continue;
    prefillers.push_back(w);
  }
  const absl::Time now = absl::Now();
  prefillers = LoraAffinity(prefillers, request_->lora_name(), now);
  if (prefillers.empty()) {
    host_->RecordDecision(routing_reason::kNoWorker);
    return false;
  }
  const std::vector<uint64_t> hashes =
      PromptBlockHashes(*request_, ClusterBlockSize(host_->registry()),
                        ReportedLoraCacheKey(host_->registry().All(), request_->lora_name()));
  std::vector<RouteCandidate> candidates = RouteCandidates(prefillers, hashes, now);
  // A prefill worker's load is its calls in flight, not KV blocks (it holds none afterwards).
  for (auto& c : candidates) c.load_blocks = c.worker->inflight_requests.load();
  RouteChoice choice =
      host_->Choose(PlacementRole::kPrefill, candidates, static_cast<int64_t>(hashes.size()));
  worker_ = candidates[choice.index].worker;
  worker_->NoteRouted(hashes, now + o.routing.pending_block_ttl);
  worker_->NoteLoraRouted(request_->lora_name(), now + o.routing.pending_block_ttl);
  host_->RecordDecision(choice.reason);
  worker_->inflight_requests.fetch_add(1);
  worker_->routed_requests.fetch_add(1);

  const v1::DecodeRequest& r = *request_;
  call_request_.Clear();
  call_request_.set_request_id(r.request_id());
  *call_request_.mutable_prompt_token_ids() = r.prompt_token_ids();
  *call_request_.mutable_prior_output_token_ids() = r.prior_output_token_ids();
  *call_request_.mutable_sampling() = r.sampling();
  call_request_.set_n(r.n());
  call_request_.set_priority(r.priority());
  call_request_.set_cache_salt(r.cache_salt());
  call_request_.set_tenant(r.tenant());
  call_request_.set_lora_name(r.lora_name());
  call_request_.set_lora_path(r.lora_path());
  *call_request_.mutable_target() = reservation_;
  // The prefill worker gets only this attempt's key: with it, it can begin no other attempt
  // (kvtransfer README, "Transfer ids and the sender binding").
  call_request_.mutable_target()->set_transfer_key(
      TransferAttemptKey(reservation_.transfer_key(), attempt_));
  // The transport of this pair (both were admitted, so one exists; a worker that re-registered
  // with another since fails the call, which is retried).
  absl::StatusOr<std::string> transport =
      PairKvTransport(KvTransportPeerFromInfo(worker_->address, worker_->info),
                      KvTransportPeerFromInfo(decode_->address, decode_->info));
  if (transport.ok()) call_request_.mutable_target()->set_kv_transport(*transport);
  call_request_.set_attempt(attempt_);
  response_.Clear();
  context_ = std::make_unique<grpc::ClientContext>();
  context_->set_deadline(absl::ToChronoTime(absl::Now() + o.prefill_timeout));
  worker_->stub->async()->Prefill(context_.get(), &call_request_, &response_,
                                  [done = std::move(done)](grpc::Status st) { done(st); });
  return true;
}

void PrefillLeg::CallEnded(const grpc::Status& status) {
  if (worker_) worker_->inflight_requests.fetch_sub(1);
}

bool PrefillLeg::Failed(const grpc::Status& status) {
  TLOG(WARNING) << "request " << request_->request_id() << ": prefill on " << worker_->address
                << " failed (" << status.error_message() << ")";
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    host_->registry().ReportFailure(worker_);
  }
  failed_.push_back(worker_.get());
  // Metrics: the prefill is re-sent, to another prefill worker or to the decode worker.
  host_->RecordRetry("prefill");
  if (++attempt_ >= static_cast<uint32_t>(host_->options().max_prefill_attempts)) return false;
  host_->mutable_counters().prefill_retries.fetch_add(1);
  return true;
}

void PrefillLeg::CancelCall() {
  if (context_ != nullptr) context_->TryCancel();
}

}  // namespace tandem
