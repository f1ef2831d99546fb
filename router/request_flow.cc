#include "router/request_flow.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "router/cluster_client.h"
#include "router/decode_leg.h"
#include "router/lora_routing.h"
#include "router/placement.h"

namespace tandem {
namespace {

// A status that says the decode worker (or the way to it) failed, rather than the request: its
// samples move to another decode worker.
bool IsWorkerFailure(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return true;
    default:
      return false;
  }
}

}  // namespace

RequestFlow::RequestFlow(FlowHost* host, const v1::DecodeRequest& request,
                         InferenceClient::ResponseCallback callback)
    : host_(host), request_(request), callback_(std::move(callback)) {
  samples_.resize(request.n() <= 0 ? 1 : request.n());
}

void RequestFlow::Start() {
  std::vector<int32_t> all(samples_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>(i);
  if (!StartLeg(all, {}, false)) {
    FinishWithError(all, grpc::StatusCode::UNAVAILABLE, "no decode worker is available");
  }
}

v1::DecodeRequest RequestFlow::NextLegRequestLocked(const std::vector<int32_t>& indices) {
  v1::DecodeRequest leg = request_;
  const bool whole = indices.size() == samples_.size() && indices.size() != 1;
  if (!whole && !(samples_.size() == 1 && leg_counter_ == 0)) {
    // A single sample continues: n = 1, its own random stream (sample i was seeded seed + i),
    // and the tokens it already streamed as prior output.
    const int32_t index = indices[0];
    leg.set_n(1);
    leg.set_request_id(absl::StrCat(request_.request_id(), "/s", index, ".", leg_counter_));
    if (request_.sampling().has_seed()) {
      leg.mutable_sampling()->set_seed(request_.sampling().seed() + index);
    }
    const auto& delivered = samples_[index].delivered;
    leg.mutable_prior_output_token_ids()->Assign(delivered.begin(), delivered.end());
  } else if (leg_counter_ > 0) {
    // A whole request again (a local retry after failed remote prefills): its own id, so the
    // worker never refuses it as a duplicate of the attempt it is still cancelling.
    leg.set_request_id(absl::StrCat(request_.request_id(), "/r", leg_counter_));
  }
  ++leg_counter_;
  return leg;
}

bool RequestFlow::StartLeg(const std::vector<int32_t>& indices, const std::vector<Worker*>& exclude,
                           bool force_local) {
  const ClusterOptions& o = host_->options();
  WorkerRegistry& registry = host_->registry();
  const int64_t block_size = ClusterBlockSize(registry);

  v1::DecodeRequest leg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    leg = NextLegRequestLocked(indices);
  }

  const absl::Time now = absl::Now();
  std::vector<std::shared_ptr<Worker>> decoders;
  for (auto& w : registry.Healthy("decode")) {
    if (std::find(exclude.begin(), exclude.end(), w.get()) == exclude.end()) decoders.push_back(w);
  }
  // Adapter affinity first (the workers holding the request's LoRA adapter, else those that can
  // load it), then the policy among them.
  decoders = LoraAffinity(decoders, leg.lora_name(), now, &o.routing);
  if (decoders.empty()) {
    host_->RecordDecision(routing_reason::kNoWorker);
    return false;
  }
  const std::vector<uint64_t> hashes =
      PromptBlockHashes(leg, block_size, ReportedLoraCacheKey(registry.All(), leg.lora_name()));
  std::vector<RouteCandidate> candidates = RouteCandidates(decoders, hashes, now);
  RouteChoice choice =
      host_->Choose(PlacementRole::kDecode, candidates, static_cast<int64_t>(hashes.size()));
  const RouteCandidate& chosen = candidates[choice.index];
  chosen.worker->NoteRouted(hashes, now + o.routing.pending_block_ttl);
  chosen.worker->NoteLoraRouted(leg.lora_name(), now + o.routing.pending_block_ttl);
  host_->RecordDecision(choice.reason);

  // Conditional disaggregation. Blocks the decode worker holds in its KV cache tiers count as
  // cached by what loading them saves (TierCredit): a prompt mostly held there is loaded and
  // finished locally rather than prefilled again remotely.
  const int64_t total = leg.prompt_token_ids_size() + leg.prior_output_token_ids_size();
  const int64_t uncached = total - static_cast<int64_t>((static_cast<double>(chosen.cached_blocks) +
                                                         TierCredit(o.routing, chosen)) *
                                                        static_cast<double>(block_size));
  bool remote = !force_local && uncached >= o.disagg_min_uncached_tokens;
  if (remote) {
    bool any_free = false;
    for (auto& p : registry.Healthy("prefill")) {
      if (p != chosen.worker && p->inflight_requests.load() < o.max_prefills_per_worker) {
        any_free = true;
      }
    }
    remote = any_free;
  }
  leg.set_remote_prefill(remote);
  leg.set_kv_lease_ms(o.kv_lease_ms);
  ClusterCounters& counters = host_->mutable_counters();
  (remote ? counters.remote_prefills : counters.local_prefills).fetch_add(1);
  host_->RecordDecision(remote ? routing_reason::kRemotePrefill : routing_reason::kLocalPrefill);

  const int64_t max_tokens = leg.sampling().has_max_tokens() ? leg.sampling().max_tokens() : 16;
  const int64_t load = (total + max_tokens + block_size - 1) / block_size * leg.n();
  auto handle =
      std::make_shared<DecodeLeg>(shared_from_this(), chosen.worker, std::move(leg), indices, load);
  {
    std::lock_guard<std::mutex> lock(mu_);
    legs_.push_back(handle);
  }
  handle->Start(handle);
  return true;
}

void RequestFlow::OnResponse(DecodeLeg* leg, const v1::DecodeResponse& r) {
  v1::DecodeResponse out = r;
  bool error = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    const auto& indices = leg->indices();
    if (r.has_tokens()) {
      const int32_t local = r.tokens().index();
      if (local < 0 || local >= static_cast<int32_t>(indices.size())) return;
      Sample& s = samples_[indices[local]];
      if (s.finished) return;
      s.delivered.insert(s.delivered.end(), r.tokens().token_ids().begin(),
                         r.tokens().token_ids().end());
      out.mutable_tokens()->set_index(indices[local]);
    } else if (r.has_final()) {
      if (r.final().finish_reason() == v1::FINISH_REASON_ERROR) {
        error = true;
        for (Sample& s : samples_) s.finished = true;
      } else {
        const int32_t local = r.final().index();
        if (local < 0 || local >= static_cast<int32_t>(indices.size())) return;
        Sample& s = samples_[indices[local]];
        if (s.finished) return;
        s.finished = true;
        out.mutable_final()->set_index(indices[local]);
        out.mutable_final()->mutable_usage()->set_completion_tokens(
            static_cast<int32_t>(s.delivered.size()));
      }
    } else {
      return;
    }
  }
  callback_(out);
  if (error) {
    std::vector<std::shared_ptr<DecodeLeg>> legs;
    {
      std::lock_guard<std::mutex> lock(mu_);
      legs = legs_;
    }
    for (auto& l : legs) {
      if (l.get() != leg) l->Cancel(-1);
    }
  }
}

void RequestFlow::OnLegDone(DecodeLeg* leg, const grpc::Status& status, bool retry_local) {
  std::vector<int32_t> unfinished;
  bool cancelled;
  bool streamed = false;  // some unfinished sample already sent tokens: a mid-stream move
  std::shared_ptr<Worker> worker = leg->worker();
  {
    std::lock_guard<std::mutex> lock(mu_);
    legs_.erase(
        std::remove_if(legs_.begin(), legs_.end(), [leg](const auto& l) { return l.get() == leg; }),
        legs_.end());
    for (int32_t i : leg->indices()) {
      if (samples_[i].finished) continue;
      unfinished.push_back(i);
      streamed |= !samples_[i].delivered.empty();
    }
    cancelled = cancelled_;
    if (cancelled) {
      for (int32_t i : unfinished) samples_[i].finished = true;
    }
  }
  if (unfinished.empty() || cancelled) {
    MaybeDone();
    return;
  }
  if (retry_local) {
    // The prefill could not be done remotely: the same decode worker computes it.
    if (!StartLeg(unfinished, {}, true)) {
      FinishWithError(unfinished, grpc::StatusCode::UNAVAILABLE, "no decode worker is available");
    }
    return;
  }
  if (!IsWorkerFailure(status.error_code())) {
    FinishWithError(
        unfinished, status.error_code(),
        status.ok() ? "the decode worker ended the stream early" : status.error_message());
    return;
  }
  host_->registry().ReportFailure(worker);
  int migrations;
  {
    std::lock_guard<std::mutex> lock(mu_);
    migrations = ++migrations_;
  }
  if (migrations > host_->options().max_migrations) {
    FinishWithError(
        unfinished, grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("decode workers failed ", migrations - 1, " times: ", status.error_message()));
    return;
  }
  host_->mutable_counters().migrations.fetch_add(1);
  // Metrics: a stream that had sent tokens migrates; one that had not is simply re-sent.
  if (streamed) {
    host_->RecordMigration();
  } else {
    host_->RecordRetry("decode");
  }
  TLOG(WARNING) << "request " << request_.request_id() << ": decode worker " << worker->address
                << " failed (" << status.error_message() << "); migrating " << unfinished.size()
                << " sample(s)";
  for (int32_t index : unfinished) {
    if (!StartLeg({index}, {worker.get()}, false)) {
      FinishWithError({index}, grpc::StatusCode::UNAVAILABLE,
                      "no other decode worker is available for migration");
      return;
    }
  }
}

void RequestFlow::FinishWithError(const std::vector<int32_t>& indices, grpc::StatusCode code,
                                  const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    for (Sample& s : samples_) s.finished = true;
  }
  host_->mutable_counters().failures.fetch_add(1);
  v1::DecodeResponse r;
  r.mutable_final()->set_index(indices.empty() ? 0 : indices[0]);
  r.mutable_final()->set_finish_reason(v1::FINISH_REASON_ERROR);
  r.mutable_final()->set_error_code(static_cast<int32_t>(code));
  r.mutable_final()->set_error_message(message);
  callback_(r);
  std::vector<std::shared_ptr<DecodeLeg>> legs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    legs = legs_;
  }
  for (auto& l : legs) l->Cancel(-1);
  MaybeDone();
}

void RequestFlow::Cancel(int32_t index) {
  std::vector<std::pair<std::shared_ptr<DecodeLeg>, int32_t>> targets;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index < 0) cancelled_ = true;
    for (auto& l : legs_) {
      const auto& indices = l->indices();
      if (index < 0) {
        targets.emplace_back(l, -1);
        continue;
      }
      auto it = std::find(indices.begin(), indices.end(), index);
      if (it != indices.end()) {
        // Only that sample stops; its final (ABORT) still comes through the stream.
        targets.emplace_back(l, static_cast<int32_t>(it - indices.begin()));
      }
    }
  }
  for (auto& [leg, local] : targets) leg->Cancel(local);
  MaybeDone();
}

void RequestFlow::MaybeDone() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ || !legs_.empty()) return;
    for (const Sample& s : samples_) {
      if (!s.finished) return;
    }
    done_ = true;
  }
  host_->FlowDone(request_.request_id());
}

}  // namespace tandem
