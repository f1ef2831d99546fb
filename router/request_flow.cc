#include "router/request_flow.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/block_hash.h"
#include "common/base/log.h"

namespace tandem {
namespace {

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

// Hashes of the full blocks of the tokens a worker would hold for this request.
std::vector<uint64_t> PromptBlockHashes(const v1::DecodeRequest& r, int64_t block_size) {
  std::vector<int32_t> tokens(r.prompt_token_ids().begin(), r.prompt_token_ids().end());
  tokens.insert(tokens.end(), r.prior_output_token_ids().begin(), r.prior_output_token_ids().end());
  if (block_size <= 0 || tokens.size() < 2) return {};
  // Like the engine: only blocks within the first len - 1 tokens can be hits.
  std::vector<uint64_t> hashes((tokens.size() - 1) / block_size);
  ComputeBlockHashes(absl::MakeSpan(tokens).subspan(0, tokens.size() - 1), block_size,
                     HashSalt(r.cache_salt()), hashes.data());
  return hashes;
}

std::vector<RouteCandidate> Candidates(const std::vector<std::shared_ptr<Worker>>& workers,
                                       const std::vector<uint64_t>& hashes, absl::Time now) {
  std::vector<RouteCandidate> c;
  for (const auto& w : workers) {
    RouteCandidate x;
    x.worker = w;
    x.cached_blocks = w->CachedPrefix(hashes, now);
    x.load_blocks = w->inflight_blocks.load();
    c.push_back(std::move(x));
  }
  return c;
}

int64_t BlockSize(const WorkerRegistry* registry) {
  auto layout = registry->layout();
  return layout.has_value() ? layout->block_size() : 16;
}

}  // namespace

// ------------------------------------------------------------------------------ RequestFlow

RequestFlow::RequestFlow(ClusterClient* client, const v1::DecodeRequest& request,
                         InferenceClient::ResponseCallback callback)
    : client_(client), request_(request), callback_(std::move(callback)) {
  samples_.resize(request.n() <= 0 ? 1 : request.n());
}

void RequestFlow::Start() {
  std::vector<int32_t> all(samples_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int32_t>(i);
  if (!StartLeg(all, {}, false)) {
    FinishWithError(all, grpc::StatusCode::UNAVAILABLE, "no decode worker is available");
  }
}

bool RequestFlow::StartLeg(const std::vector<int32_t>& indices, const std::vector<Worker*>& exclude,
                           bool force_local) {
  const ClusterOptions& o = client_->options_;
  WorkerRegistry* registry = client_->registry_;
  const int64_t block_size = BlockSize(registry);

  v1::DecodeRequest leg = request_;
  const bool whole = indices.size() == samples_.size() && indices.size() != 1;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
  }

  std::vector<std::shared_ptr<Worker>> decoders;
  for (auto& w : registry->Healthy("decode")) {
    if (std::find(exclude.begin(), exclude.end(), w.get()) == exclude.end()) decoders.push_back(w);
  }
  if (decoders.empty()) {
    client_->RecordDecision(routing_reason::kNoWorker);
    return false;
  }
  const std::vector<uint64_t> hashes = PromptBlockHashes(leg, block_size);
  const absl::Time now = absl::Now();
  std::vector<RouteCandidate> candidates = Candidates(decoders, hashes, now);
  RouteChoice choice = ChooseWorker(o.routing, candidates, static_cast<int64_t>(hashes.size()),
                                    &client_->decode_counter_);
  const RouteCandidate& chosen = candidates[choice.index];
  chosen.worker->NoteRouted(hashes, now + o.routing.pending_block_ttl);
  client_->RecordDecision(choice.reason);

  // Conditional disaggregation.
  const int64_t total = leg.prompt_token_ids_size() + leg.prior_output_token_ids_size();
  const int64_t uncached = total - chosen.cached_blocks * block_size;
  bool remote = !force_local && uncached >= o.disagg_min_uncached_tokens;
  if (remote) {
    bool any_free = false;
    for (auto& p : registry->Healthy("prefill")) {
      if (p != chosen.worker && p->inflight_requests.load() < o.max_prefills_per_worker) {
        any_free = true;
      }
    }
    remote = any_free;
  }
  leg.set_remote_prefill(remote);
  leg.set_kv_lease_ms(o.kv_lease_ms);
  (remote ? client_->counters_.remote_prefills : client_->counters_.local_prefills).fetch_add(1);
  client_->RecordDecision(remote ? routing_reason::kRemotePrefill : routing_reason::kLocalPrefill);

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
  std::vector<int32_t> all_indices;
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
        for (size_t i = 0; i < samples_.size(); ++i) all_indices.push_back(static_cast<int32_t>(i));
      } else {
        const int32_t local = r.final().index();
        if (local < 0 || local >= static_cast<int32_t>(indices.size())) return;
        Sample& s = samples_[indices[local]];
        if (s.finished) return;
        s.finished = true;
        out.mutable_final()->set_index(indices[local]);
        out.mutable_final()->mutable_usage()->set_completion_tokens(
            static_cast<int32_t>(s.delivered.size()));
        double prefill_s = 0, transfer_s = 0;
        if (leg->PrefillTimings(&prefill_s, &transfer_s)) {
          v1::Timings* t = out.mutable_final()->mutable_timings();
          t->set_remote(true);
          t->set_remote_prefill_s(prefill_s);
          t->set_kv_transfer_s(transfer_s);
        }
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
  std::shared_ptr<Worker> worker = leg->worker_ptr();
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
  client_->registry_->ReportFailure(worker);
  int migrations;
  {
    std::lock_guard<std::mutex> lock(mu_);
    migrations = ++migrations_;
  }
  if (migrations > client_->options_.max_migrations) {
    FinishWithError(
        unfinished, grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("decode workers failed ", migrations - 1, " times: ", status.error_message()));
    return;
  }
  client_->counters_.migrations.fetch_add(1);
  // Metrics: a stream that had sent tokens migrates; one that had not is simply re-sent.
  if (streamed) {
    client_->RecordMigration();
  } else {
    client_->RecordRetry("decode");
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
  client_->counters_.failures.fetch_add(1);
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
  client_->FlowDone(request_.request_id());
}

// ------------------------------------------------------------------------------- DecodeLeg

DecodeLeg::DecodeLeg(std::shared_ptr<RequestFlow> flow, std::shared_ptr<Worker> decode,
                     v1::DecodeRequest request, std::vector<int32_t> indices, int64_t load_blocks)
    : flow_(std::move(flow)),
      decode_(std::move(decode)),
      request_(std::move(request)),
      indices_(std::move(indices)),
      load_blocks_(load_blocks) {
  decode_->inflight_requests.fetch_add(1);
  decode_->inflight_blocks.fetch_add(load_blocks_);
  decode_->routed_requests.fetch_add(1);
}

DecodeLeg::~DecodeLeg() = default;

void DecodeLeg::Start(std::shared_ptr<DecodeLeg> self) {
  self_ = std::move(self);
  decode_->stub->async()->Decode(&context_, &request_, this);
  StartRead(&message_);
  StartCall();
}

void DecodeLeg::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows
  if (message_.has_reservation()) {
    StartPrefill(message_.reservation());
  } else if (!HoldFinal(message_)) {
    flow_->OnResponse(this, message_);
  }
  StartRead(&message_);
}

bool DecodeLeg::HoldFinal(const v1::DecodeResponse& r) {
  bool arm = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (r.has_tokens()) kv_arrived_ = true;
    if (!r.has_final() || r.final().finish_reason() == v1::FINISH_REASON_ERROR) return false;
    kv_arrived_ = true;
    if (!releasing_ && (!prefill_in_flight_ || hold_expired_)) return false;
    held_finals_.push_back(r);
    arm = !alarm_requested_ && !hold_expired_;
    if (arm) {
      alarm_requested_ = true;
      alarm_keep_ = self_;  // the reader thread: self_ is set until the leg ends
    }
  }
  if (arm) {
    // Set and Cancel under alarm_mu_, never under mu_ (the callback takes mu_). The callback
    // captures no reference: grpc keeps it until the alarm is destroyed.
    std::lock_guard<std::mutex> lock(alarm_mu_);
    alarm_.Set(absl::ToChronoTime(absl::Now() + flow_->client()->options_.prefill_timings_wait),
               [this](bool fired) { OnAlarm(fired); });
    alarm_set_ = true;
  }
  return true;
}

void DecodeLeg::OnAlarm(bool fired) {
  std::shared_ptr<DecodeLeg> keep;
  {
    std::lock_guard<std::mutex> lock(mu_);
    keep = std::move(alarm_keep_);
    if (fired) hold_expired_ = true;
  }
  // Not fired: cancelled, the Prefill response released the finals.
  if (fired) ReleaseFinals();
}  // may delete this

void DecodeLeg::ReleaseFinals() {
  std::unique_lock<std::mutex> lock(mu_);
  if (releasing_) return;  // that thread delivers these too, and ends the leg if due
  releasing_ = true;
  while (!held_finals_.empty()) {
    std::vector<v1::DecodeResponse> held = std::move(held_finals_);
    held_finals_.clear();
    lock.unlock();
    for (const v1::DecodeResponse& r : held) flow_->OnResponse(this, r);
    lock.lock();
  }
  releasing_ = false;
  const bool finish = finish_held_;
  finish_held_ = false;
  const grpc::Status status = finish_status_;
  const bool retry_local = retry_local_;
  lock.unlock();
  if (finish) FinishLeg(status, retry_local);
}

void DecodeLeg::OnDone(const grpc::Status& status) {
  bool retry_local;
  {
    std::unique_lock<std::mutex> lock(mu_);
    ended_ = true;
    retry_local = retry_local_;
    if (!held_finals_.empty() || releasing_) {
      // Finals are held for the Prefill response: the leg ends after they are delivered.
      finish_held_ = true;
      finish_status_ = status;
      if (status.ok() && prefill_in_flight_ && !hold_expired_) return;
      hold_expired_ = true;  // the stream failed: deliver them now
      lock.unlock();
      ReleaseFinals();
      return;
    }
  }
  FinishLeg(status, retry_local);
}

void DecodeLeg::FinishLeg(const grpc::Status& status, bool retry_local) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (prefill_context_ != nullptr) prefill_context_->TryCancel();
  }
  decode_->inflight_requests.fetch_sub(1);
  decode_->inflight_blocks.fetch_sub(load_blocks_);
  flow_->OnLegDone(this, status, retry_local);
  std::shared_ptr<DecodeLeg> self = std::move(self_);  // may delete this on return
}

void DecodeLeg::StartPrefill(const v1::KvReservation& reservation) {
  ClusterClient* client = flow_->client();
  const ClusterOptions& o = client->options_;
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return;
  reservation_ = reservation;
  std::vector<std::shared_ptr<Worker>> prefillers;
  for (auto& w : client->registry_->Healthy("prefill")) {
    if (w == decode_) continue;
    if (std::find(failed_prefill_.begin(), failed_prefill_.end(), w.get()) !=
        failed_prefill_.end()) {
      continue;
    }
    prefillers.push_back(w);
  }
  if (prefillers.empty()) {
    // No prefill worker left to try: the decode worker prefills itself (the reservation is
    // released by cancelling this stream).
    client->RecordDecision(routing_reason::kNoWorker);
    retry_local_ = true;
    context_.TryCancel();
    return;
  }
  v1::DecodeRequest as_decode = request_;
  const std::vector<uint64_t> hashes = PromptBlockHashes(as_decode, BlockSize(client->registry_));
  const absl::Time now = absl::Now();
  std::vector<RouteCandidate> candidates = Candidates(prefillers, hashes, now);
  for (auto& c : candidates) c.load_blocks = c.worker->inflight_requests.load();
  RouteChoice choice = ChooseWorker(o.routing, candidates, static_cast<int64_t>(hashes.size()),
                                    &client->prefill_counter_);
  prefill_ = candidates[choice.index].worker;
  prefill_->NoteRouted(hashes, now + o.routing.pending_block_ttl);
  client->RecordDecision(choice.reason);
  prefill_->inflight_requests.fetch_add(1);
  prefill_->routed_requests.fetch_add(1);

  prefill_request_.Clear();
  prefill_request_.set_request_id(request_.request_id());
  *prefill_request_.mutable_prompt_token_ids() = request_.prompt_token_ids();
  *prefill_request_.mutable_prior_output_token_ids() = request_.prior_output_token_ids();
  *prefill_request_.mutable_sampling() = request_.sampling();
  prefill_request_.set_n(request_.n());
  prefill_request_.set_priority(request_.priority());
  prefill_request_.set_cache_salt(request_.cache_salt());
  *prefill_request_.mutable_target() = reservation_;
  prefill_request_.set_attempt(attempt_);
  prefill_response_.Clear();
  prefill_context_ = std::make_unique<grpc::ClientContext>();
  prefill_context_->set_deadline(absl::ToChronoTime(absl::Now() + o.prefill_timeout));
  std::shared_ptr<DecodeLeg> keep = self_;
  prefill_in_flight_ = true;
  prefill_->stub->async()->Prefill(prefill_context_.get(), &prefill_request_, &prefill_response_,
                                   [keep](grpc::Status st) { keep->OnPrefillDone(st); });
}

void DecodeLeg::OnPrefillDone(const grpc::Status& status) {
  ClusterClient* client = flow_->client();
  std::shared_ptr<Worker> prefill;
  {
    std::lock_guard<std::mutex> lock(mu_);
    prefill = prefill_;
  }
  if (prefill) prefill->inflight_requests.fetch_sub(1);
  std::unique_lock<std::mutex> lock(mu_);
  prefill_in_flight_ = false;
  if (status.ok()) prefill_ok_ = true;
  if (!held_finals_.empty() || finish_held_) {
    lock.unlock();
    {
      std::lock_guard<std::mutex> alarm_lock(alarm_mu_);
      if (alarm_set_) alarm_.Cancel();  // not set yet: it fires later and finds nothing held
    }
    ReleaseFinals();  // now with the timings (when the call succeeded)
    lock.lock();
  }
  // Once the decode worker streams tokens it has verified the KV: a Prefill call that fails
  // afterwards (its answer was lost) is not sent again.
  if (ended_ || status.ok() || kv_arrived_) return;
  TLOG(WARNING) << "request " << request_.request_id() << ": prefill on " << prefill->address
                << " failed (" << status.error_message() << ")";
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    client->registry_->ReportFailure(prefill);
  }
  failed_prefill_.push_back(prefill.get());
  // Metrics: the prefill is re-sent, to another prefill worker or to the decode worker.
  client->RecordRetry("prefill");
  if (++attempt_ >= static_cast<uint32_t>(client->options_.max_prefill_attempts)) {
    retry_local_ = true;
    context_.TryCancel();
    return;
  }
  client->counters_.prefill_retries.fetch_add(1);
  // Same reservation, next attempt, another prefill worker (DESIGN §2 "Failures").
  const v1::KvReservation reservation = reservation_;
  lock.unlock();
  StartPrefill(reservation);
}

bool DecodeLeg::PrefillTimings(double* prefill_s, double* transfer_s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!prefill_ok_) return false;
  *prefill_s = prefill_response_.prefill_s();
  *transfer_s = prefill_response_.transfer_s();
  return true;
}

void DecodeLeg::SendCancel(const std::shared_ptr<Worker>& worker, int32_t index) {
  struct Call {
    grpc::ClientContext context;
    v1::CancelRequest request;
    v1::CancelResponse response;
  };
  auto* call = new Call;
  call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  call->request.set_request_id(request_.request_id());
  call->request.set_index(index);
  worker->stub->async()->Cancel(&call->context, &call->request, &call->response,
                                [call](grpc::Status) { delete call; });
}

void DecodeLeg::Cancel(int32_t local_index) {
  if (local_index >= 0) {
    SendCancel(decode_, local_index);
    return;
  }
  std::shared_ptr<Worker> prefill;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return;
    prefill = prefill_;
  }
  SendCancel(decode_, -1);
  if (prefill) SendCancel(prefill, -1);
  context_.TryCancel();
}

}  // namespace tandem
