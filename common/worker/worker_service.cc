#include "common/worker/worker_service.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/engine/lora/lora_registry.h"
#include "common/rpc/byte_buffer.h"
#include "common/rpc/write_queue.h"
#include "common/worker/lora_on_demand.h"

namespace tandem {
namespace {

grpc::Status ToGrpcStatus(const absl::Status& st) {
  return grpc::Status(static_cast<grpc::StatusCode>(st.code()), std::string(st.message()));
}

}  // namespace

v1::WorkerStats ToWorkerStats(const EngineStats& s) {
  v1::WorkerStats out;
  out.set_running(s.num_running);
  out.set_waiting(s.num_waiting);
  out.set_kv_blocks_total(s.kv_blocks_total);
  out.set_kv_blocks_used(s.kv_blocks_used);
  out.set_kv_blocks_cached(s.kv_blocks_cached);
  out.set_kv_reserved_token_slots(s.kv_reserved_token_slots);
  out.set_kv_filled_token_slots(s.kv_filled_token_slots);
  out.set_prompt_tokens(s.prompt_tokens);
  out.set_generated_tokens(s.generated_tokens);
  out.set_prefix_cache_queried_tokens(s.prefix_cache_queried);
  out.set_prefix_cache_hit_tokens(s.prefix_cache_hit);
  out.set_preemptions(s.preemptions);
  out.set_steps(s.steps);
  out.set_awaiting_kv(s.num_awaiting_kv);
  out.set_kv_blocks_held(s.kv_blocks_held);
  // KV cache tiers: one entry per tier on, with its measured read cost (the watch stream adds
  // the tier's block events).
  if (s.kv_tiers.enabled) {
    for (int t = 0; t < 2; ++t) {
      const KvTierCounters& c = s.kv_tiers.tier[t];
      if (!c.enabled) continue;
      v1::KvTierEvents* e = out.add_tier_events();
      e->set_medium(t == 0 ? v1::KV_MEDIUM_HOST : v1::KV_MEDIUM_DISK);
      e->set_load_seconds_per_block(c.load_seconds_per_block);
    }
    out.set_prefill_seconds_per_block(s.kv_tiers.prefill_seconds_per_block);
  }
  return out;
}

// One Decode stream. Responses arrive on the engine thread and are queued; only the holder of
// the writer role (common/rpc/write_queue.h) calls StartWrite or Finish, so the reactor outlives
// every call on it.
class DecodeCall : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  DecodeCall(WorkerService* service, const v1::DecodeRequest& request)
      : service_(service), request_id_(request.request_id()) {
    service_->CallStarted();
  }

  // `parsed`: the outcome of parsing the raw request (an error ends the call with it).
  static void Begin(std::shared_ptr<DecodeCall> self, const v1::DecodeRequest& request,
                    const grpc::Status& parsed) {
    self->self_ = self;
    std::unique_lock<std::mutex> lock(self->mu_);
    if (!parsed.ok()) {
      self->status_ = parsed;
    } else if (self->service_->decode_ == nullptr) {
      self->status_ = grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "not a decode worker");
    } else if (self->service_->draining_.load()) {
      self->status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is shutting down");
    }
    if (self->status_.has_value()) {
      self->PumpLocked(lock);
      return;
    }
    self->open_ = request.n() == 0 ? 1 : request.n();
    lock.unlock();
    self->service_->decode_->Decode(request,
                                    [self](const v1::DecodeResponse& r) { self->OnResponse(r); });
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    writes_.WriteDone();
    if (!ok && !status_.has_value()) {
      service_->decode_->Cancel(request_id_, -1);
      writes_.Clear();
      status_ = grpc::Status(grpc::StatusCode::CANCELLED, "router went away");
    }
    PumpLocked(lock);
  }

  void OnCancel() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (open_ > 0 && service_->decode_ != nullptr) service_->decode_->Cancel(request_id_, -1);
    writes_.Clear();
    if (!status_.has_value()) status_ = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    PumpLocked(lock);
  }

  void OnDone() override {
    std::shared_ptr<DecodeCall> self;
    RequestOutcome outcome;
    {
      std::lock_guard<std::mutex> lock(mu_);
      self.swap(self_);
      // A stream that ended OK may still carry an error inside its final.
      outcome = OutcomeForStatusCode(status_.has_value() && !status_->ok()
                                         ? static_cast<absl::StatusCode>(status_->error_code())
                                         : error_code_);
    }
    service_->CallEnded(outcome);
  }

 private:
  void OnResponse(const v1::DecodeResponse& r) {
    std::unique_lock<std::mutex> lock(mu_);
    if (status_.has_value()) return;
    writes_.Push(r);
    if (r.has_final()) {
      if (r.final().finish_reason() == v1::FINISH_REASON_ERROR) {
        error_code_ = r.final().error_code() != 0
                          ? static_cast<absl::StatusCode>(r.final().error_code())
                          : absl::StatusCode::kInternal;
      }
      if (r.final().finish_reason() == v1::FINISH_REASON_ERROR || --open_ <= 0) {
        status_ = grpc::Status::OK;  // errors travel inside SampleFinal
      }
    }
    PumpLocked(lock);
  }

  void PumpLocked(std::unique_lock<std::mutex>& lock) { writes_.Pump(this, lock, status_); }

  WorkerService* service_;
  std::string request_id_;
  std::mutex mu_;
  WriteQueue<v1::DecodeResponse> writes_;
  int32_t open_ = 0;
  std::optional<grpc::Status> status_;
  absl::StatusCode error_code_ = absl::StatusCode::kOk;  // of an error final, if any
  std::shared_ptr<DecodeCall> self_;
};

// One WatchStats stream, fed by the service's ticker: a message goes out only when the previous
// one was written, so a slow router never makes the worker queue unboundedly.
class WatchCall : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit WatchCall(WorkerService* service) : service_(service) {}

  // Called by the ticker. Returns false once the stream is over.
  bool Tick() {
    std::unique_lock<std::mutex> lock(mu_);
    if (done_) return false;
    if (writing_ || finishing_) return true;
    KvEventLog::Delta delta =
        service_->events_ != nullptr ? service_->events_->Read(cursor_) : KvEventLog::Delta{};
    cursor_ = delta.next_cursor;
    v1::WorkerStats message = service_->Stats();
    message.set_snapshot(delta.snapshot);
    message.mutable_stored_block_hashes()->Assign(delta.stored.begin(), delta.stored.end());
    message.mutable_removed_block_hashes()->Assign(delta.removed.begin(), delta.removed.end());
    for (int t = 0; t < 2; ++t) {
      if (delta.tier_stored[t].empty() && delta.tier_removed[t].empty() && !delta.snapshot)
        continue;
      const v1::KvMedium medium = t == 0 ? v1::KV_MEDIUM_HOST : v1::KV_MEDIUM_DISK;
      v1::KvTierEvents* e = nullptr;
      for (v1::KvTierEvents& x : *message.mutable_tier_events()) {
        if (x.medium() == medium) e = &x;
      }
      if (e == nullptr) {  // a tier that turned itself off still reports its removals
        e = message.add_tier_events();
        e->set_medium(medium);
      }
      e->mutable_stored_block_hashes()->Assign(delta.tier_stored[t].begin(),
                                               delta.tier_stored[t].end());
      e->mutable_removed_block_hashes()->Assign(delta.tier_removed[t].begin(),
                                                delta.tier_removed[t].end());
    }
    message_ = SerializeToByteBuffer(message);
    writing_ = true;
    lock.unlock();
    StartWrite(&message_);
    return true;
  }

  // Ends the stream (with `status` unless a write is in flight: then OK after it).
  void End(const grpc::Status& status = grpc::Status::OK) {
    std::unique_lock<std::mutex> lock(mu_);
    if (finishing_ || done_) return;
    finishing_ = true;
    if (!writing_) {
      lock.unlock();
      Finish(status);
    }
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok && !finishing_) finishing_ = true;
    if (finishing_) {
      lock.unlock();
      Finish(grpc::Status::OK);
    }
  }

  void OnCancel() override { End(); }

  void OnDone() override {
    std::shared_ptr<WatchCall> self;
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    self.swap(self_);
  }

  std::shared_ptr<WatchCall> self_;  // keeps the reactor alive until OnDone

 private:
  WorkerService* service_;
  std::mutex mu_;
  grpc::ByteBuffer message_;
  uint64_t cursor_ = 0;
  bool writing_ = false;
  bool finishing_ = false;
  bool done_ = false;
};

WorkerService::WorkerService(const WorkerServiceOptions& options, AsyncEngine* engine,
                             KvEventLog* events, DecodeHandler* decode, PrefillHandler* prefill,
                             WorkerHooks* hooks)
    : options_(options),
      engine_(engine),
      events_(events),
      decode_(decode),
      prefill_(prefill),
      hooks_(hooks) {
  ticker_ = std::thread([this] { TickerLoop(); });
}

WorkerService::~WorkerService() { Stop(); }

void WorkerService::Stop() {
  std::vector<std::shared_ptr<WatchCall>> watchers;
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    if (stop_) return;
    stop_ = true;
    watchers.swap(watchers_);
  }
  watch_cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
  for (auto& w : watchers) w->End();
}

void WorkerService::StartDrain() {
  draining_.store(true);
  options_.info.set_draining(true);
  if (hooks_ != nullptr) hooks_->SetDraining(true);
}

void WorkerService::CallStarted() {
  active_.fetch_add(1);
  if (hooks_ != nullptr) hooks_->StreamStarted();
}

void WorkerService::CallEnded(RequestOutcome outcome) {
  if (hooks_ != nullptr) hooks_->StreamFinished(outcome);
  active_.fetch_sub(1);
}

void WorkerService::TickerLoop() {
  std::unique_lock<std::mutex> lock(watch_mu_);
  while (!stop_) {
    watch_cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.watch_interval));
    if (stop_) break;
    std::vector<std::shared_ptr<WatchCall>> live;
    std::vector<std::shared_ptr<WatchCall>> current = watchers_;
    lock.unlock();
    for (auto& w : current) {
      if (w->Tick()) live.push_back(w);
    }
    lock.lock();
    // Keep watchers added while unlocked.
    for (auto& w : watchers_) {
      if (std::find(current.begin(), current.end(), w) == current.end()) live.push_back(w);
    }
    watchers_.swap(live);
  }
}

v1::WorkerStats WorkerService::Stats() const {
  v1::WorkerStats s = ToWorkerStats(engine_->stats());
  int64_t transfers = 0;
  if (decode_ != nullptr) transfers += decode_->transfers_in_flight();
  if (prefill_ != nullptr) transfers += prefill_->transfers_in_flight();
  s.set_transfers_in_flight(transfers);
  AddLoraStats(engine_->engine().lora_registry().get(), &s);
  return s;
}

namespace {

// Parses a raw unary request; on failure finishes the reactor with INVALID_ARGUMENT.
bool ParseOrFinish(const grpc::ByteBuffer* raw, google::protobuf::MessageLite* request,
                   grpc::ServerUnaryReactor* reactor) {
  grpc::Status st = ParseRawRequest(*raw, request);
  if (!st.ok()) reactor->Finish(st);
  return st.ok();
}

}  // namespace

grpc::ServerUnaryReactor* WorkerService::GetInfo(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* raw,
                                                 grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  v1::InfoRequest request;
  if (!ParseOrFinish(raw, &request, reactor)) return reactor;
  v1::WorkerInfo info = options_.info;
  info.set_draining(draining_.load());
  *response = SerializeToByteBuffer(info);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* WorkerService::Decode(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw) {
  v1::DecodeRequest request;
  const grpc::Status parsed = ParseRawRequest(*raw, &request);
  auto call = std::make_shared<DecodeCall>(this, request);
  DecodeCall::Begin(call, request, parsed);
  return call.get();
}

grpc::ServerUnaryReactor* WorkerService::Prefill(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* raw,
                                                 grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  auto refuse = [&](const grpc::Status& status) {
    if (hooks_ != nullptr) {
      hooks_->StreamStarted();
      hooks_->StreamFinished(
          OutcomeForStatusCode(static_cast<absl::StatusCode>(status.error_code())));
    }
    reactor->Finish(status);
    return reactor;
  };
  v1::PrefillRequest request;
  if (grpc::Status st = ParseRawRequest(*raw, &request); !st.ok()) return refuse(st);
  if (prefill_ == nullptr) {
    return refuse(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "not a prefill worker"));
  }
  if (draining_.load()) {
    return refuse(grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is shutting down"));
  }
  CallStarted();
  prefill_->Prefill(
      request, [this, reactor, response](const absl::Status& st, const v1::PrefillResponse& r) {
        *response = SerializeToByteBuffer(r);
        CallEnded(OutcomeForStatusCode(st.code()));
        reactor->Finish(st.ok() ? grpc::Status::OK
                                : grpc::Status(static_cast<grpc::StatusCode>(st.code()),
                                               std::string(st.message())));
      });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerService::Cancel(grpc::CallbackServerContext* context,
                                                const grpc::ByteBuffer* raw,
                                                grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  v1::CancelRequest request;
  if (!ParseOrFinish(raw, &request, reactor)) return reactor;
  if (decode_ != nullptr) decode_->Cancel(request.request_id(), request.index());
  if (prefill_ != nullptr) prefill_->Cancel(request.request_id());
  *response = SerializeToByteBuffer(v1::CancelResponse());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* WorkerService::GetStats(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* raw,
                                                  grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  v1::StatsRequest request;
  if (!ParseOrFinish(raw, &request, reactor)) return reactor;
  *response = SerializeToByteBuffer(Stats());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* WorkerService::LoadLoraAdapter(grpc::CallbackServerContext* context,
                                                         const v1::WorkerLoraRequest* request,
                                                         v1::LoraAdapterState* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  LoraRegistry* registry = engine_->engine().lora_registry().get();
  absl::Status st = registry == nullptr
                        ? absl::FailedPreconditionError("LoRA is not enabled (--enable-lora)")
                        : registry->Acquire(request->lora_name(), request->lora_path());
  if (st.ok()) {
    std::shared_ptr<const LoraAdapter> a = registry->Find(request->lora_name());
    response->set_name(request->lora_name());
    response->set_path(request->lora_path());
    if (a != nullptr) response->set_cache_key(a->cache_key);
  }
  reactor->Finish(ToGrpcStatus(st));
  return reactor;
}

grpc::ServerUnaryReactor* WorkerService::UnloadLoraAdapter(grpc::CallbackServerContext* context,
                                                           const v1::WorkerLoraRequest* request,
                                                           v1::LoraAdapterState* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  LoraRegistry* registry = engine_->engine().lora_registry().get();
  absl::Status st = absl::FailedPreconditionError("LoRA is not enabled (--enable-lora)");
  if (registry != nullptr) {
    auto in_use = registry->Unload(request->lora_name());
    st = in_use.status();
    if (in_use.ok()) {
      response->set_name(request->lora_name());
      response->set_in_use(*in_use);
    }
  }
  reactor->Finish(ToGrpcStatus(st));
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* WorkerService::WatchStats(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw) {
  auto call = std::make_shared<WatchCall>(this);
  call->self_ = call;
  v1::StatsRequest request;
  if (grpc::Status st = ParseRawRequest(*raw, &request); !st.ok()) {
    call->End(st);
    return call.get();
  }
  std::unique_lock<std::mutex> lock(watch_mu_);
  if (stop_) {
    lock.unlock();
    call->End();
  } else {
    watchers_.push_back(call);
    lock.unlock();
    call->Tick();  // the snapshot goes out at once
  }
  return call.get();
}

}  // namespace tandem
