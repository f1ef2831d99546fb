#include "common/grammar/compile_service.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace tandem::grammar {
namespace compile_service_internal {

struct Job;

// One submission waiting for a result. `job`, `resolved` and `tenant` bookkeeping are guarded
// by Core::mu; the result, `ready` and `cancelled` by cb_mu (the callback runs under it, so
// Cancel waits for a running callback).
struct Waiter {
  std::string tenant;
  std::function<void()> on_ready;
  std::shared_ptr<Job> job;  // until resolved
  bool resolved = false;

  std::mutex cb_mu;
  bool cancelled = false;
  CompileResult result = absl::UnknownError("not ready");
  std::atomic<bool> ready{false};
  bool in_submit = false;  // answered by Submit itself (set before the handle is returned)
};

// One compilation, shared by every waiter of the same constraint.
struct Job {
  std::string key;
  Constraint constraint;
  GrammarTask task;  // SubmitTask: run instead of a compilation
  CompileBudget budget;
  enum class State { kQueued, kRunning, kDone } state = State::kQueued;
  std::vector<std::shared_ptr<Waiter>> waiters;
  explicit Job(int64_t budget_ms) : budget(budget_ms) {}
};

struct Tenant {
  std::deque<std::shared_ptr<Waiter>> queue;  // waiters whose queued job this tenant may start
  int64_t pending = 0;                        // unresolved waiters
  int64_t running = 0;                        // jobs started on this tenant's turn, running
  uint64_t served = 0;                        // when it last started a job (0: never)
};

struct Core {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  absl::flat_hash_map<std::string, Tenant> tenants;
  uint64_t serve_clock = 0;
  uint64_t next_task = 0;                                           // SubmitTask's keys
  absl::flat_hash_map<std::string, std::shared_ptr<Job>> inflight;  // key -> queued/running job
  int64_t pending = 0;
  GrammarCompileServiceStats stats;  // counters (the gauges are computed in stats())

  // Marks `w` resolved and drops it from its tenant's books; mu held.
  void ResolveLocked(Waiter* w) {
    w->resolved = true;
    w->job.reset();
    --pending;
    auto it = tenants.find(w->tenant);
    Tenant& t = it->second;
    --t.pending;
    for (auto q = t.queue.begin(); q != t.queue.end(); ++q) {
      if (q->get() == w) {
        t.queue.erase(q);
        break;
      }
    }
    MaybeEraseLocked(it);
  }

  // Forgets an idle tenant; mu held.
  void MaybeEraseLocked(absl::flat_hash_map<std::string, Tenant>::iterator it) {
    const Tenant& t = it->second;
    if (t.pending == 0 && t.running == 0 && t.queue.empty()) tenants.erase(it);
  }

  // The next job to start (null: none may start now); mu held. Of the tenants with a queued job
  // and a free running slot, the one served least recently (a tenant new to the queue first)
  // starts its oldest: with one worker, a newcomer waits for the compilation running at most.
  std::pair<std::shared_ptr<Job>, std::string> PickLocked(int32_t max_running) {
    Tenant* best = nullptr;
    const std::string* best_name = nullptr;
    for (auto& [name, t] : tenants) {
      // Entries whose job already started on another tenant's turn wait for it unqueued.
      while (!t.queue.empty() && t.queue.front()->job->state != Job::State::kQueued) {
        t.queue.pop_front();
      }
      if (t.queue.empty() || t.running >= max_running) continue;
      if (best == nullptr || t.served < best->served) {
        best = &t;
        best_name = &name;
      }
    }
    if (best == nullptr) return {nullptr, ""};
    std::shared_ptr<Job> job = best->queue.front()->job;
    best->queue.pop_front();
    ++best->running;
    best->served = ++serve_clock;
    return {std::move(job), *best_name};
  }
};

// Sets the result and calls the callback (unless cancelled); no Core lock held.
void Deliver(Waiter* w, const CompileResult& result, bool call) {
  std::lock_guard<std::mutex> lock(w->cb_mu);
  if (w->cancelled) return;
  w->result = result;
  w->ready.store(true, std::memory_order_release);
  if (call && w->on_ready) w->on_ready();
}

}  // namespace compile_service_internal

using compile_service_internal::Core;
using compile_service_internal::Job;
using compile_service_internal::Tenant;
using compile_service_internal::Waiter;

GrammarCompileHandle::~GrammarCompileHandle() { Cancel(); }

bool GrammarCompileHandle::ready() const { return waiter_->ready.load(std::memory_order_acquire); }

const CompileResult& GrammarCompileHandle::result() const { return waiter_->result; }

bool GrammarCompileHandle::answered_in_submit() const { return waiter_->in_submit; }

const CompileResult& GrammarCompileHandle::Wait() const {
  while (!ready()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  return waiter_->result;
}

void GrammarCompileHandle::Cancel() {
  Waiter* w = waiter_.get();
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (!w->resolved) {
      std::shared_ptr<Job> job = w->job;
      auto& ws = job->waiters;
      ws.erase(std::remove_if(ws.begin(), ws.end(), [w](const auto& p) { return p.get() == w; }),
               ws.end());
      core_->ResolveLocked(w);
      if (ws.empty() && job->state != Job::State::kDone) {
        // Nobody waits any more: a queued job is dropped (its queue entries went with its
        // waiters), a running one stops at its next budget check.
        if (job->state == Job::State::kRunning) job->budget.Cancel();
        job->state = job->state == Job::State::kQueued ? Job::State::kDone : job->state;
        auto it = core_->inflight.find(job->key);
        if (it != core_->inflight.end() && it->second == job) core_->inflight.erase(it);
        ++core_->stats.abandoned;
      }
    }
  }
  std::lock_guard<std::mutex> lock(w->cb_mu);  // waits for a callback running now
  w->cancelled = true;
  if (!w->ready.load(std::memory_order_relaxed)) {
    w->result = absl::CancelledError("constraint: grammar compilation cancelled");
    w->ready.store(true, std::memory_order_release);
  }
}

GrammarCompileService::GrammarCompileService(std::shared_ptr<GrammarCompiler> compiler,
                                             GrammarCompileServiceOptions options)
    : compiler_(std::move(compiler)), options_(options), core_(std::make_shared<Core>()) {
  for (int32_t i = 0; i < std::max(1, options_.threads); ++i) {
    workers_.emplace_back([this] { Work(); });
  }
}

GrammarCompileService::~GrammarCompileService() {
  std::vector<std::shared_ptr<Waiter>> orphans;
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->stop = true;
    for (auto& [key, job] : core_->inflight) {
      job->budget.Cancel();
      for (auto& w : job->waiters) orphans.push_back(w);
      job->waiters.clear();
    }
    for (auto& w : orphans) core_->ResolveLocked(w.get());
  }
  core_->cv.notify_all();
  for (std::thread& t : workers_) t.join();
  for (auto& w : orphans) {
    compile_service_internal::Deliver(
        w.get(), absl::UnavailableError("constraint: the grammar compile service shut down"),
        /*call=*/false);
  }
}

std::unique_ptr<GrammarCompileHandle> GrammarCompileService::Submit(
    const std::string& tenant, const Constraint& constraint, std::function<void()> on_ready) {
  auto w = std::make_shared<Waiter>();
  w->tenant = tenant;
  std::unique_ptr<GrammarCompileHandle> handle(new GrammarCompileHandle(core_, w));
  const std::string key = GrammarCompiler::CacheKey(constraint);
  std::shared_ptr<const CompiledGrammar> cached = compiler_->Lookup(key);
  std::optional<CompileResult> now;  // the answer known inside Submit
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    ++core_->stats.submitted;
    auto t = core_->tenants.find(tenant);
    const int64_t tenant_pending = t == core_->tenants.end() ? 0 : t->second.pending;
    if (cached != nullptr) {
      ++core_->stats.cache_hits;
      now = std::move(cached);
    } else if (core_->stop) {
      now = absl::UnavailableError("constraint: the grammar compile service shut down");
    } else if (tenant_pending >= options_.max_pending_per_tenant) {
      ++core_->stats.rejected;
      now = absl::ResourceExhaustedError(absl::StrCat(
          "constraint: this tenant has ", tenant_pending, " grammar compilations pending (at most ",
          options_.max_pending_per_tenant, "); retry when they finish"));
    } else if (core_->pending >= options_.max_pending) {
      ++core_->stats.rejected;
      now = absl::ResourceExhaustedError(absl::StrCat("constraint: ", core_->pending,
                                                      " grammar compilations pending (at most ",
                                                      options_.max_pending, "); retry later"));
    } else {
      std::shared_ptr<Job>& job = core_->inflight[key];
      if (job == nullptr) {
        job = std::make_shared<Job>(options_.budget_ms);
        job->key = key;
        job->constraint = constraint;
      } else {
        ++core_->stats.deduplicated;
      }
      w->on_ready = std::move(on_ready);
      w->job = job;
      job->waiters.push_back(w);
      Tenant& tn = core_->tenants[tenant];
      ++tn.pending;
      ++core_->pending;
      if (job->state == Job::State::kQueued) {
        tn.queue.push_back(w);
        core_->cv.notify_one();
      }
      return handle;
    }
    w->resolved = true;  // never queued: Cancel has nothing to undo
  }
  // Nobody else has the waiter yet: no callback, no lock needed.
  w->in_submit = true;
  w->result = std::move(*now);
  w->ready.store(true, std::memory_order_release);
  return handle;
}

std::unique_ptr<GrammarCompileHandle> GrammarCompileService::SubmitTask(
    const std::string& tenant, const std::string& what, GrammarTask task,
    std::function<void()> on_ready) {
  auto w = std::make_shared<Waiter>();
  w->tenant = tenant;
  std::unique_ptr<GrammarCompileHandle> handle(new GrammarCompileHandle(core_, w));
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    if (!core_->stop) {
      // A key no constraint has (CacheKey starts with the kind's number): never shared.
      auto job = std::make_shared<Job>(options_.budget_ms);
      job->key = absl::StrCat("task\x1f", ++core_->next_task);
      job->task = std::move(task);
      job->budget.set_what(what);
      core_->inflight[job->key] = job;
      w->on_ready = std::move(on_ready);
      w->job = job;
      job->waiters.push_back(w);
      Tenant& tn = core_->tenants[tenant];
      ++tn.pending;
      ++core_->pending;
      tn.queue.push_back(w);
      core_->cv.notify_one();
      return handle;
    }
    w->resolved = true;
  }
  w->result = absl::UnavailableError("constraint: the grammar compile service shut down");
  w->ready.store(true, std::memory_order_release);
  return handle;
}

void GrammarCompileService::Work() {
  if (options_.nice != 0) {
    // Linux: a thread's niceness is its own (setpriority on its thread id).
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), options_.nice);
  }
  std::unique_lock<std::mutex> lock(core_->mu);
  while (true) {
    if (core_->stop) return;
    auto [job, tenant] = core_->PickLocked(options_.max_running_per_tenant);
    if (job == nullptr) {
      core_->cv.wait(lock);
      continue;
    }
    job->state = Job::State::kRunning;
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    CompileResult result = std::shared_ptr<const CompiledGrammar>();
    if (job->task) {
      if (absl::Status st = job->task(&job->budget); !st.ok()) result = st;
    } else {
      result = compiler_->Compile(job->constraint, &job->budget);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lock.lock();
    job->state = Job::State::kDone;
    auto it = core_->inflight.find(job->key);
    if (it != core_->inflight.end() && it->second == job) core_->inflight.erase(it);
    auto t = core_->tenants.find(tenant);
    --t->second.running;
    core_->MaybeEraseLocked(t);
    GrammarCompileServiceStats& s = core_->stats;
    const bool over_budget = job->budget.failed() && !job->budget.cancelled();
    if (job->task) {
      ++s.tasks;
      if (!result.ok()) ++s.tasks_failed;
      if (over_budget) ++s.tasks_budget_exceeded;
    } else {
      ++s.compiles;
      s.compile_seconds += seconds;
      s.max_compile_seconds = std::max(s.max_compile_seconds, seconds);
      if (!result.ok()) ++s.failed;
      if (over_budget) ++s.budget_exceeded;
    }
    std::vector<std::shared_ptr<Waiter>> waiters = std::move(job->waiters);
    job->waiters.clear();
    job->task = nullptr;  // what it captured goes now
    for (auto& w : waiters) core_->ResolveLocked(w.get());
    lock.unlock();
    core_->cv.notify_all();  // this tenant may start its next job
    for (auto& w : waiters) compile_service_internal::Deliver(w.get(), result, /*call=*/true);
    lock.lock();
  }
}

GrammarCompileServiceStats GrammarCompileService::stats() const {
  GrammarCompileServiceStats s;
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    s = core_->stats;
    for (const auto& [key, job] : core_->inflight) {
      if (job->state == Job::State::kQueued) ++s.queued;
      if (job->state == Job::State::kRunning) ++s.running;
    }
    for (const auto& [name, t] : core_->tenants) s.tenants.push_back({name, t.pending, t.running});
  }
  std::sort(s.tenants.begin(), s.tenants.end(),
            [](const auto& a, const auto& b) { return a.tenant < b.tenant; });
  s.memory = compiler_->memory_stats();
  return s;
}

}  // namespace tandem::grammar
