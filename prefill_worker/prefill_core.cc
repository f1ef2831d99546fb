#include "prefill_worker/prefill_core.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/log.h"
#include "common/cluster/kv_transport_pair.h"
#include "common/worker/lora_on_demand.h"
#include "common/worker/proto_convert.h"
#include "kvtransfer/auth.h"
#include "kvtransfer/transfer_window.h"

namespace tandem {
namespace {

// Zero-copy: the transport's own deadline comes this much later, so that the engine request has
// ended (cancelled at its transfer time) before the transport could end the transfer and the decode
// worker reuse its blocks.
constexpr absl::Duration kZeroCopyAbortMargin = absl::Seconds(10);

}  // namespace

// One Prefill call. Fields are guarded by PrefillCore::mu_ unless noted.
struct PrefillCore::Job {
  v1::PrefillRequest request;
  DoneCallback done;
  int32_t samples = 1;
  absl::Time arrival;
  absl::Time computed;  // last layer computed and first tokens sampled
  v1::FirstTokens first;
  int32_t samples_done = 0;
  bool engine_finished = false;  // the engine request ended (its blocks are held or freed)
  bool holding = false;          // blocks held for export: ReleaseHold when the job ends
  bool completed = false;        // `done` was called
  // Zero-copy: the engine writes into the decode worker's blocks (its request carries the
  // destination). The transfer ends (Abort) only after the engine's final update, and the
  // destination's mapping is held until then; past `deadline` the engine request is cancelled.
  bool zero_copy = false;
  absl::Time deadline = absl::InfiniteFuture();
  EngineRequest engine_request;  // until submitted
  // Export thread only:
  bool begun = false;
  absl::Status begin_status;
  kvtransfer::TransferHandle handle = 0;
  bool transfer_closed = false;          // Finish or Abort was called on the handle
  std::vector<int32_t> blocks;           // the sequence's block table (from layer 0)
  std::vector<int64_t> deferred_layers;  // without layer-wise push: sent at the end
  std::shared_ptr<const void> mapping;   // zero-copy: the destination's, until the cleanup
};

PrefillCore::PrefillCore(AsyncEngine* engine, int64_t block_size, bool layerwise, bool zero_copy)
    : engine_(engine), block_size_(block_size), layerwise_(layerwise), zero_copy_(zero_copy) {
  export_thread_ = std::thread([this] { ExportLoop(); });
}

PrefillCore::~PrefillCore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (export_thread_.joinable()) export_thread_.join();
  sender_.reset();
}

absl::Status PrefillCore::StartSender(const kvtransfer::SenderOptions& options,
                                      kvtransfer::KvRegionAccess* regions) {
  auto sender = kvtransfer::CreateSender(options, regions);
  if (!sender.ok()) return sender.status();
  sender_ = std::move(sender).value();
  transports_ = SpokenKvTransports(options.transport);
  return absl::OkStatus();
}

void PrefillCore::StartSender(std::unique_ptr<kvtransfer::KvSender> sender,
                              const std::string& transport) {
  sender_ = std::move(sender);
  transports_ = SpokenKvTransports(transport);
}

int64_t PrefillCore::transfers_in_flight() const { return sender_ ? sender_->num_in_flight() : 0; }

void PrefillCore::Enqueue(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

absl::Status PrefillCore::CheckTargetWindow(const v1::KvReservation& target,
                                            int64_t num_tokens) const {
  // No window: a decode worker that reserved every page of every layer (the transfer sends the
  // local layers' released regions as zeros, which that worker never reads).
  if (target.window_layers_size() == 0 && target.window_first() == 0) return absl::OkStatus();
  const Engine& engine = engine_->engine();
  const std::vector<int64_t> got(target.window_layers().begin(), target.window_layers().end());
  if (absl::Status st = kvtransfer::ValidateTransferWindow(
          got, target.window_first(), engine.model().config().num_layers,
          static_cast<size_t>(target.dst_blocks_size()));
      !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("target: ", st.message()));
  }
  const Engine::TransferWindow want = engine.RemoteTransferWindow(num_tokens);
  // Without a window layout this worker holds every block of every layer: any part of it can be
  // sent. With one it holds the local layers' pages of the same window the decode worker
  // reserved, and only those.
  if (want.layers.empty()) return absl::OkStatus();
  if (got != want.layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("target.window_layers: [", absl::StrJoin(got, ","),
                     "] differ from this worker's local (sliding-window) layers [",
                     absl::StrJoin(want.layers, ","), "]"));
  }
  const int64_t first = std::max<int64_t>(0, want.first_block - target.first_block());
  if (target.window_first() != first) {
    return absl::InvalidArgumentError(
        absl::StrCat("target.window_first: ", target.window_first(), " but the window of a ",
                     num_tokens, "-token prompt starts at block ", want.first_block, ", position ",
                     first, " of the reservation's dst_blocks"));
  }
  return absl::OkStatus();
}

void PrefillCore::Prefill(const v1::PrefillRequest& request, DoneCallback done) {
  auto e = EngineRequestFromProto(request);
  if (!e.ok()) {
    done(e.status(), {});
    return;
  }
  if (sender_ == nullptr) {
    done(absl::FailedPreconditionError("this worker has no KV sender (not a prefill worker)"), {});
    return;
  }
  const int64_t total = request.prompt_token_ids_size() + request.prior_output_token_ids_size();
  const int64_t blocks = (total + block_size_ - 1) / block_size_;
  const auto& target = request.target();
  if (target.first_block() < 0 ||
      int64_t{target.first_block()} + target.dst_blocks_size() != blocks) {
    done(absl::InvalidArgumentError(
             absl::StrCat("target: reservation of ", target.dst_blocks_size(),
                          " blocks from block ", target.first_block(), " does not cover a ", total,
                          "-token prompt (", blocks, " blocks of ", block_size_, ")")),
         {});
    return;
  }
  if (absl::Status st = CheckTargetWindow(target, total); !st.ok()) {
    done(st, {});
    return;
  }
  // Host names are at most 253 bytes; a longer endpoint is garbage (and must not be echoed).
  constexpr size_t kMaxEndpointBytes = 300;
  if (target.kv_endpoint().size() > kMaxEndpointBytes) {
    done(
        absl::InvalidArgumentError(absl::StrCat("target.kv_endpoint: ", target.kv_endpoint().size(),
                                                " bytes, longer than ", kMaxEndpointBytes)),
        {});
    return;
  }
  if (absl::Status st = CheckTargetTransport(target.kv_transport()); !st.ok()) {
    done(st, {});
    return;
  }
  // The decode worker accepts the transfer only from a sender proving its key.
  if (target.transfer_key().size() != kvtransfer::kTransferKeyBytes) {
    done(absl::InvalidArgumentError(
             absl::StrCat("target.transfer_key: ", target.transfer_key().size(), " bytes, not the ",
                          kvtransfer::kTransferKeyBytes, " of the decode worker's reservation")),
         {});
    return;
  }
  // The adapter, loaded on demand when the router says from where; it must be the one the
  // decode worker reserved for (its cache key in the target), and its key goes with the KV
  // (FirstTokens.lora_cache_key), which the decode worker checks again.
  auto lora = AcquireRequestLora(engine_->engine().lora_registry().get(), request.lora_name(),
                                 request.lora_path());
  if (!lora.ok()) {
    done(lora.status(), {});
    return;
  }
  if (*lora != target.lora_cache_key()) {
    done(absl::FailedPreconditionError(absl::StrCat(
             "target.lora_cache_key: the decode worker reserved for ",
             target.lora_cache_key() == 0
                 ? std::string("the base model")
                 : absl::StrCat("LoRA adapter cache key ",
                                absl::Hex(target.lora_cache_key(), absl::kZeroPad16)),
             " but ",
             request.lora_name().empty()
                 ? std::string("this request runs the base model")
                 : absl::StrCat("LoRA adapter '", request.lora_name(), "' here has cache key ",
                                absl::Hex(*lora, absl::kZeroPad16)))),
         {});
    return;
  }
  auto job = std::make_shared<Job>();
  job->request = request;
  job->first.set_lora_cache_key(*lora);
  job->done = std::move(done);
  job->samples = request.n() == 0 ? 1 : request.n();
  job->arrival = absl::Now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (jobs_.count(request.request_id()) != 0) {
      job->completed = true;
    } else {
      jobs_[request.request_id()] = job;
    }
  }
  if (job->completed) {
    job->done(absl::AlreadyExistsError(
                  absl::StrCat("request_id: '", request.request_id(), "' is already prefilling")),
              {});
    return;
  }

  e->prefill_only = true;
  e->export_hooks = std::make_shared<KvExportHooks>();
  std::weak_ptr<Job> weak = job;
  e->export_hooks->on_layer = [this, weak](const std::vector<int32_t>& blocks, int64_t layer) {
    // Engine thread: queue only.
    auto j = weak.lock();
    if (!j) return;
    Task t;
    t.job = j;
    t.layer = layer;
    if (layer == 0) t.blocks = blocks;
    Enqueue(std::move(t));
  };
  job->engine_request = *std::move(e);
  const std::string& transport =
      target.kv_transport().empty() ? transports_.front() : target.kv_transport();
  if (zero_copy_ && transport == "cuda-ipc") {
    Task t;  // Begin (which may block) on the export thread, before the engine computes
    t.job = job;
    t.begin = true;
    Enqueue(std::move(t));
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  Submit(job);
}

void PrefillCore::Submit(const std::shared_ptr<Job>& job) {
  // Under mu_: a Complete (cancel) that follows cancels a request already submitted.
  engine_->Submit(std::move(job->engine_request),
                  [this, job](const SequenceUpdate& u) { OnEngineUpdate(job, u); });
}

void PrefillCore::NothingSubmitted(const std::shared_ptr<Job>& job) {
  std::lock_guard<std::mutex> lock(mu_);
  job->engine_finished = true;  // no engine request to cancel
}

void PrefillCore::BeginZeroCopy(const std::shared_ptr<Job>& job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (job->completed) return;  // cancelled before anything began
  }
  const v1::KvReservation& target = job->request.target();
  kvtransfer::TransferTarget t = MakeTarget(*job, /*zero_copy=*/true);
  const absl::Time deadline = t.deadline - kZeroCopyAbortMargin;
  auto handle = sender_->Begin(t, {});
  if (absl::IsUnimplemented(handle.status())) {
    // Nothing of the transfer was sent: the same attempt goes copying (Begin at layer 0).
    TLOG(INFO) << "prefill of " << job->request.request_id()
               << ": KV copied, not zero-copy: " << handle.status().message();
    std::lock_guard<std::mutex> lock(mu_);
    if (!job->completed) Submit(job);
    return;
  }
  if (!handle.ok()) {
    NothingSubmitted(job);
    Complete(job, handle.status());
    return;
  }
  job->begun = true;
  job->handle = *handle;
  auto dest = sender_->Destination(*handle);
  const size_t region = engine_->engine().backend().kv_spec().bytes_per_block_layer();
  if (!dest.ok() || dest->block_stride != region ||
      dest->blocks.size() != static_cast<size_t>(target.dst_blocks_size())) {
    job->transfer_closed = true;
    sender_->Abort(job->handle);  // the engine wrote nothing
    NothingSubmitted(job);
    Complete(job,
             absl::InternalError(absl::StrCat(
                 "zero-copy destination unusable: ",
                 dest.ok() ? "its blocks are not this pool's regions" : dest.status().ToString())));
    return;
  }
  auto pool = std::make_shared<RemoteKvPool>();
  const int64_t layers = engine_->engine().backend().kv_spec().num_layers;
  for (int64_t l = 0; l < layers; ++l)
    pool->layer_base.push_back(dest->base + l * dest->layer_stride);
  // The blocks one layer of the mapped pool spans (every destination region lies inside it).
  pool->num_blocks = dest->layer_stride > 0
                         ? static_cast<int64_t>(dest->layer_stride / dest->block_stride)
                         : 1 + *std::max_element(dest->blocks.begin(), dest->blocks.end());
  pool->mapping = dest->mapping;
  auto destination = std::make_shared<KvDestination>();
  destination->first_block = target.first_block();
  destination->blocks = dest->blocks;
  destination->pool = std::move(pool);
  job->mapping = dest->mapping;
  job->engine_request.kv_destination = std::move(destination);
  std::lock_guard<std::mutex> lock(mu_);
  if (job->completed) {  // cancelled meanwhile: nothing was submitted, nothing written
    job->transfer_closed = true;
    sender_->Abort(job->handle);
    job->mapping.reset();
    return;
  }
  job->zero_copy = true;
  job->deadline = deadline;
  Submit(job);
}

void PrefillCore::OnEngineUpdate(const std::shared_ptr<Job>& job, const SequenceUpdate& u) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!u.held_blocks.empty()) job->holding = true;
  if (job->completed) {
    // The job ended (cancelled) while the engine was finishing it: nobody will export. A
    // zero-copy transfer ends now, its writes over (Complete left that to this update).
    const bool release = !u.held_blocks.empty();
    const bool end_transfer = u.finished && job->zero_copy && !job->engine_finished;
    if (u.finished) job->engine_finished = true;
    lock.unlock();
    const std::string id = job->request.request_id();
    if (release) engine_->Post([id](Engine& e) { e.ReleaseHold(id); });
    if (end_transfer) {
      Task cleanup;
      cleanup.job = job;
      cleanup.cleanup = true;
      Enqueue(std::move(cleanup));
    }
    return;
  }
  if (!u.new_tokens.empty()) {
    if (job->first.token_ids_size() <= u.index)
      job->first.mutable_token_ids()->Resize(job->samples, 0);
    job->first.set_token_ids(u.index, u.new_tokens[0]);
    if (!u.logprobs.empty()) {
      while (job->first.logprobs_size() < job->samples) job->first.add_logprobs();
      LogprobsToProto(u.logprobs[0], job->first.mutable_logprobs(u.index));
    }
  }
  if (!u.finished) return;
  if (!u.status.ok() || u.finish_reason == FinishReason::kAbort) {
    job->engine_finished = true;
    lock.unlock();
    Complete(job, u.status.ok() ? absl::CancelledError("prefill cancelled") : u.status);
    return;
  }
  if (++job->samples_done < job->samples) return;
  job->engine_finished = true;
  job->computed = absl::Now();
  lock.unlock();
  Task t;
  t.job = job;
  t.finish = true;
  Enqueue(std::move(t));
}

std::vector<std::shared_ptr<PrefillCore::Job>> PrefillCore::ExpiredLocked(absl::Time now) const {
  std::vector<std::shared_ptr<Job>> expired;
  for (const auto& [id, job] : jobs_) {
    if (job->zero_copy && !job->engine_finished && job->deadline <= now) expired.push_back(job);
  }
  return expired;
}

void PrefillCore::ExportLoop() {
  while (true) {
    std::optional<Task> task;
    std::vector<std::shared_ptr<Job>> expired;
    {
      std::unique_lock<std::mutex> lock(mu_);
      while (!stop_ && tasks_.empty()) {
        // A zero-copy job's deadline: its engine request is cancelled (then its transfer ends
        // after the engine's final update), before the transport's own deadline could end it.
        absl::Time next = absl::InfiniteFuture();
        for (const auto& [id, job] : jobs_) {
          if (job->zero_copy && !job->engine_finished) next = std::min(next, job->deadline);
        }
        if (next <= absl::Now()) break;
        if (next == absl::InfiniteFuture()) {
          cv_.wait(lock);
        } else {
          cv_.wait_until(lock, absl::ToChronoTime(next));
        }
      }
      if (stop_ && tasks_.empty()) return;
      expired = ExpiredLocked(absl::Now());
      if (!tasks_.empty()) {
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
    }
    for (const auto& job : expired) {
      Complete(job, absl::DeadlineExceededError(
                        absl::StrCat("prefill and zero-copy KV transfer took longer than ",
                                     absl::FormatDuration(transfer_time_))));
    }
    if (task.has_value()) RunTask(*task);
  }
}

void PrefillCore::RunTask(Task& task) {
  Job& job = *task.job;
  bool completed, zero_copy;
  {
    std::lock_guard<std::mutex> lock(mu_);
    completed = job.completed;
    zero_copy = job.zero_copy;
  }
  if (task.begin) {
    BeginZeroCopy(task.job);
    return;
  }
  if (completed || task.cleanup) {
    // A zero-copy transfer ends only at its cleanup, which follows the engine's final update:
    // its ABORT must not let the decode worker reuse blocks the engine may still write.
    if (zero_copy && !task.cleanup) return;
    if (job.begun && job.begin_status.ok() && !job.transfer_closed) {
      job.transfer_closed = true;
      sender_->Abort(job.handle);
    }
    if (task.cleanup) job.mapping.reset();
    return;
  }
  if (task.layer == 0) job.blocks = task.blocks;
  if (task.layer >= 0 && !layerwise_) {
    job.deferred_layers.push_back(task.layer);
    return;
  }
  if (task.finish && !layerwise_) {
    for (int64_t layer : job.deferred_layers) {
      Task t;
      t.job = task.job;
      t.layer = layer;
      SendLayerNow(t);
    }
  }
  if (task.layer >= 0) {
    SendLayerNow(task);
    return;
  }
  if (!task.finish) return;
  if (!job.begun || !job.begin_status.ok()) {
    Complete(task.job, job.begun ? job.begin_status
                                 : absl::InternalError("no layer was exported for this prompt"));
    return;
  }
  std::shared_ptr<Job> keep = task.job;
  job.transfer_closed = true;
  // This worker's part of the TTFT split travels with the KV (the decode worker reports it).
  job.first.set_prefill_s(absl::ToDoubleSeconds(job.computed - job.arrival));
  sender_->Finish(job.handle, job.first.SerializeAsString(),
                  [this, keep](absl::Status st) { Complete(keep, std::move(st)); });
}

absl::Status PrefillCore::CheckTargetTransport(const std::string& transport) const {
  if (std::find(transports_.begin(), transports_.end(), transport) != transports_.end()) {
    return absl::OkStatus();
  }
  const std::string spoken = absl::StrJoin(transports_, ",");
  if (transport.empty()) {
    if (transports_.size() == 1) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("target.kv_transport: empty, and this worker speaks ", spoken, " (name one)"));
  }
  constexpr size_t kMaxEchoed = 32;  // a transport name; longer input is not echoed
  return absl::InvalidArgumentError(absl::StrCat(
      "target.kv_transport: '",
      transport.size() <= kMaxEchoed ? transport : transport.substr(0, kMaxEchoed) + "...",
      "' is not one this worker speaks (", spoken, ")"));
}

kvtransfer::TransferTarget PrefillCore::MakeTarget(const Job& job, bool zero_copy) const {
  const v1::KvReservation& target = job.request.target();
  kvtransfer::TransferTarget t;
  t.transport = target.kv_transport();
  t.endpoint = target.kv_endpoint();
  t.incarnation = target.incarnation();
  t.transfer_id = target.transfer_id();
  t.attempt = job.request.attempt();
  t.dst_blocks.assign(target.dst_blocks().begin(), target.dst_blocks().end());
  t.window_layers.assign(target.window_layers().begin(), target.window_layers().end());
  t.window_first = target.window_first();
  t.transfer_key = target.transfer_key();
  t.zero_copy = zero_copy;
  t.deadline =
      absl::Now() + transfer_time_ + (zero_copy ? kZeroCopyAbortMargin : absl::ZeroDuration());
  return t;
}

void PrefillCore::SendLayerNow(Task& task) {
  Job& job = *task.job;
  const v1::KvReservation& target = job.request.target();
  if (!job.begun) {
    job.begun = true;
    std::vector<int32_t> src(job.blocks.begin() + target.first_block(), job.blocks.end());
    auto handle = sender_->Begin(MakeTarget(job, /*zero_copy=*/false), std::move(src));
    job.begin_status = handle.status();
    if (handle.ok()) job.handle = *handle;
  }
  if (job.begin_status.ok()) sender_->SendLayer(job.handle, task.layer);
}

void PrefillCore::Complete(const std::shared_ptr<Job>& job, absl::Status status) {
  DoneCallback done;
  v1::PrefillResponse response;
  bool release = false, engine_finished = false, zero_copy = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (job->completed) return;
    job->completed = true;
    done = std::move(job->done);
    release = job->holding;
    engine_finished = job->engine_finished;
    zero_copy = job->zero_copy;
    jobs_.erase(job->request.request_id());
    response.mutable_first_token_ids()->CopyFrom(job->first.token_ids());
    const absl::Time now = absl::Now();
    const absl::Time computed = job->computed == absl::Time() ? now : job->computed;
    response.set_prefill_s(absl::ToDoubleSeconds(computed - job->arrival));
    response.set_transfer_s(absl::ToDoubleSeconds(now - computed));
  }
  const std::string id = job->request.request_id();
  if (release) {
    engine_->Post([id](Engine& e) { e.ReleaseHold(id); });
  } else if (!engine_finished) {
    engine_->Cancel(id);  // still computing: stop it (its blocks are freed by the abort)
  }
  if (!status.ok()) {
    TLOG(WARNING) << "prefill of " << id << " failed: " << status;
  }
  // A zero-copy transfer whose engine request still computes ends after the engine's final
  // update (OnEngineUpdate queues the cleanup then).
  if (!zero_copy || engine_finished) {
    Task cleanup;
    cleanup.job = job;
    cleanup.cleanup = true;
    Enqueue(std::move(cleanup));
  }
  done(status, response);
}

void PrefillCore::Cancel(const std::string& request_id) {
  std::shared_ptr<Job> job;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = jobs_.find(request_id);
    if (it == jobs_.end()) return;
    job = it->second;
  }
  Complete(job, absl::CancelledError("prefill cancelled"));  // the export thread aborts
}

}  // namespace tandem
