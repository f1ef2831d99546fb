#include "common/engine/async_engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"

namespace tandem {
namespace {

EngineCounters ToCounters(const EngineStats& s) {
  EngineCounters c;
  c.num_running = s.num_running;
  c.num_waiting = s.num_waiting;
  c.kv_blocks_total = s.kv_blocks_total;
  c.kv_blocks_used = s.kv_blocks_used;
  c.kv_blocks_cached = s.kv_blocks_cached;
  c.steps = s.steps;
  c.preemptions = s.preemptions;
  c.prompt_tokens = s.prompt_tokens;
  c.generated_tokens = s.generated_tokens;
  c.prefix_cache_queried = s.prefix_cache_queried;
  c.prefix_cache_hit = s.prefix_cache_hit;
  c.kv_evictions = s.kv_evictions;
  EngineCounters::Grammar& g = c.grammar;
  g.compile_waiting = s.grammar_compile_waiting;
  g.mask_waiting = s.grammar_mask_waiting;
  g.queued = s.grammar_queued;
  g.running = s.grammar_running;
  g.memory_bytes = s.grammar_memory_bytes;
  const int64_t outcomes[6] = {s.grammar_cache_hits,      s.grammar_compiled,
                               s.grammar_rejected,        s.grammar_invalid,
                               s.grammar_budget_exceeded, s.grammar_cancelled};
  std::copy(outcomes, outcomes + 6, g.outcomes);
  g.masks_deferred = s.grammar_masks_deferred;
  g.mask_budget_exceeded = s.grammar_mask_budget_exceeded;
  c.lora_adapters_loaded = s.lora_adapters_loaded;
  c.lora_adapters_active = s.lora_active_adapters;
  c.lora_requests_held = s.lora_requests_held;
  return c;
}

std::string Seconds(absl::Duration d) { return absl::StrCat(absl::ToDoubleSeconds(d)); }

}  // namespace

AsyncEngine::AsyncEngine(std::unique_ptr<Engine> engine, EngineHooks* hooks)
    : engine_(std::move(engine)), hooks_(hooks) {
  stats_ = engine_->stats();
  if (hooks_ != nullptr) hooks_->OnStep(ToCounters(stats_), -1);  // capacity from the start
  // A feature made a waiting sequence ready (on its own thread): the loop runs a step.
  engine_->set_wake_listener([this] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      woken_ = true;
    }
    cv_.notify_one();
  });
  thread_ = std::thread([this] { Loop(); });
}

AsyncEngine::~AsyncEngine() { Shutdown(); }

void AsyncEngine::Push(Command command) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ingress_.push_back(std::move(command));
  }
  cv_.notify_one();
}

void AsyncEngine::Submit(EngineRequest request, Callback callback) {
  active_.fetch_add(1);
  Command c(Command::kSubmit);
  c.request = std::move(request);
  c.callback = std::move(callback);
  Push(std::move(c));
}

void AsyncEngine::Cancel(const std::string& request_id) {
  Command c(Command::kCancel);
  c.request_id = request_id;
  Push(std::move(c));
}

void AsyncEngine::FinishSequence(const std::string& request_id, int32_t index,
                                 FinishReason reason) {
  Command c(Command::kFinish);
  c.request_id = request_id;
  c.index = index;
  c.reason = reason;
  Push(std::move(c));
}

void AsyncEngine::RunOnEngineThread(const std::function<void(Engine&)>& fn) {
  Command c(Command::kRun);
  c.fn = &fn;
  c.done = std::make_shared<std::promise<void>>();
  std::future<void> done = c.done->get_future();
  Push(std::move(c));
  done.wait();
}

void AsyncEngine::Post(std::function<void(Engine&)> fn) {
  Command c(Command::kPost);
  c.posted = std::move(fn);
  Push(std::move(c));
}

EngineStats AsyncEngine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void AsyncEngine::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_ && !thread_.joinable()) return;
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  engine_->set_wake_listener(nullptr);  // waits for a wake in progress
}

void AsyncEngine::OnFinished(const SequenceUpdate& u) {
  const bool sampled = u.ttft > absl::ZeroDuration();
  if (hooks_ != nullptr) {
    FinishedSequence f;
    f.finish_reason = FinishReasonName(u.finish_reason);
    f.scheduled = sampled;
    f.produced_token = sampled;
    f.queue_seconds = absl::ToDoubleSeconds(u.queue_time);
    f.prefill_seconds = absl::ToDoubleSeconds(u.prefill_time);
    f.cached_prompt_tokens = u.cached_tokens;
    f.lora_adapter = u.lora_name;
    f.prompt_tokens = u.prompt_tokens;
    f.completion_tokens = u.completion_tokens;
    f.e2e_seconds = absl::ToDoubleSeconds(u.total_time);
    hooks_->OnSequenceFinished(f);
  }
  const LogLevel level =
      u.finish_reason == FinishReason::kError ? LogLevel::kWarning : LogLevel::kInfo;
  if (!LogEnabled(level)) return;
  LogMessage log(level, __FILE__, __LINE__);
  log.Field("event", u.status.ok() ? "finished" : "failed")
      .Field("request_id", u.request_id)
      .Field("index", absl::StrCat(u.index))
      .Field("finish_reason", FinishReasonName(u.finish_reason))
      .Field("prompt_tokens", absl::StrCat(u.prompt_tokens))
      .Field("cached_tokens", absl::StrCat(u.cached_tokens))
      .Field("completion_tokens", absl::StrCat(u.completion_tokens))
      .Field("preemptions", absl::StrCat(u.num_preemptions))
      .Field("queue_s", Seconds(u.queue_time))
      .Field("prefill_s", Seconds(u.prefill_time))
      .Field("total_s", Seconds(u.total_time));
  log.stream() << "sequence " << (u.status.ok() ? "finished" : "failed");
  if (!u.status.ok()) log.stream() << ": " << u.status;
}

void AsyncEngine::Deliver(const SequenceUpdate& u) {
  if (u.finished) OnFinished(u);
  auto it = pending_.find(u.request_id);
  if (it == pending_.end()) return;
  it->second.callback(u);
  if (u.finished && --it->second.remaining <= 0) {
    pending_.erase(it);
    active_.fetch_sub(1);
  }
}

void AsyncEngine::ApplyCommands(std::deque<Command>& commands) {
  for (Command& c : commands) {
    switch (c.kind) {
      case Command::kSubmit: {
        const std::string id = c.request.id;
        const int32_t n = c.request.n;
        if (pending_.count(id) != 0) {
          SequenceUpdate u;
          u.request_id = id;
          u.finished = true;
          u.finish_reason = FinishReason::kError;
          u.status = absl::AlreadyExistsError("request_id: '" + id + "' is already running");
          OnFinished(u);
          c.callback(u);
          active_.fetch_sub(1);
          break;
        }
        absl::Status st = engine_->AddRequest(std::move(c.request));
        if (!st.ok()) {
          SequenceUpdate u;
          u.request_id = id;
          u.finished = true;
          u.finish_reason = FinishReason::kError;
          u.status = st;
          OnFinished(u);
          c.callback(u);
          active_.fetch_sub(1);
          break;
        }
        pending_[id] = Pending{std::move(c.callback), n};
        if (LogEnabled(LogLevel::kInfo)) {
          LogMessage(LogLevel::kInfo, __FILE__, __LINE__)
                  .Field("event", "queued")
                  .Field("request_id", id)
                  .Field("n", absl::StrCat(n))
                  .stream()
              << "request queued";
        }
        break;
      }
      case Command::kCancel:
        engine_->AbortRequest(c.request_id);
        break;
      case Command::kFinish:
        engine_->FinishSequence(c.request_id, c.index, c.reason);
        break;
      case Command::kRun:
        (*c.fn)(*engine_);
        c.done->set_value();
        break;
      case Command::kPost:
        c.posted(*engine_);
        break;
    }
  }
}

void AsyncEngine::Loop() {
  while (true) {
    std::deque<Command> commands;
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!stop_ && ingress_.empty() && !engine_->HasWork()) {
        // Idle (or only sequences waiting for an external resource): sleep until a command
        // arrives, a feature signals readiness or the earliest deadline (a reservation lease)
        // passes.
        const absl::Time deadline = engine_->NextDeadline();
        auto ready = [this] { return stop_ || woken_ || !ingress_.empty(); };
        if (deadline == absl::InfiniteFuture()) {
          cv_.wait(lock, ready);
        } else {
          cv_.wait_until(lock, absl::ToChronoTime(deadline), ready);
        }
      }
      commands.swap(ingress_);
      woken_ = false;
      stopping = stop_;
    }
    ApplyCommands(commands);
    if (stopping) {
      // Abort whatever is left so every callback hears the end of its request.
      std::vector<std::string> ids;
      for (const auto& [id, p] : pending_) ids.push_back(id);
      for (const auto& id : ids) engine_->AbortRequest(id);
      std::vector<SequenceUpdate> last = engine_->Step();
      {
        std::lock_guard<std::mutex> lock(mu_);
        stats_ = engine_->stats();
      }
      for (const SequenceUpdate& u : last) Deliver(u);
      return;
    }
    const bool work = engine_->HasWork();
    const absl::Time start = absl::Now();
    std::vector<SequenceUpdate> updates = engine_->Step();
    const double step_seconds = work ? absl::ToDoubleSeconds(absl::Now() - start) : -1;
    // Publish the stats before delivering: a client that has heard the end of its request
    // then sees a snapshot in which that request no longer runs or holds blocks.
    EngineStats s = engine_->stats();
    if (hooks_ != nullptr) hooks_->OnStep(ToCounters(s), step_seconds);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_ = s;
    }
    for (const SequenceUpdate& u : updates) Deliver(u);
  }
}

}  // namespace tandem
