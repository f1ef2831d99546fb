#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/grammar/compiled_grammar.h"
#include "common/grammar/constraint.h"
#include "common/grammar/grammar_compiler.h"
#include "common/grammar/grammar_memory.h"

namespace tandem::grammar {

struct GrammarCompileServiceOptions {
  int32_t threads = 2;                  // compile worker threads
  int32_t max_running_per_tenant = 1;   // compiles started for one tenant and still running
  int32_t max_pending_per_tenant = 32;  // one tenant's submissions not answered yet
  int32_t max_pending = 1024;           // all tenants' together
  int64_t budget_ms = 2000;             // CPU time one compilation may take (<= 0: unlimited)
  int32_t nice = 10;  // the workers' scheduling niceness (Linux; 0: as the process)
};

// One tenant's share of the service, for metrics.
struct GrammarCompileTenantLoad {
  std::string tenant;
  int64_t pending = 0;  // submissions not answered yet (queued or waiting on a running compile)
  int64_t running = 0;  // compiles running on this tenant's turn
};

struct GrammarCompileServiceStats {
  int64_t submitted = 0;
  int64_t cache_hits = 0;       // answered at once from the cache
  int64_t deduplicated = 0;     // joined a compile of the same constraint already in flight
  int64_t rejected = 0;         // refused at once: the tenant's or the service's queue was full
  int64_t compiles = 0;         // compilations run to an end (ok or not)
  int64_t failed = 0;           // of which errors (invalid constraints, budget)
  int64_t budget_exceeded = 0;  // of which cut at the CPU budget
  int64_t abandoned = 0;        // compilations dropped because every waiter cancelled
  int64_t tasks = 0;            // tasks (SubmitTask) run to an end (ok or not)
  int64_t tasks_failed = 0;     // of which errors
  int64_t tasks_budget_exceeded = 0;  // of which cut at the CPU budget
  double compile_seconds = 0;         // wall time of the compilations run, summed
  double max_compile_seconds = 0;
  int64_t queued = 0;                             // compilations and tasks waiting for a worker
  int64_t running = 0;                            // compilations and tasks on a worker now
  std::vector<GrammarCompileTenantLoad> tenants;  // tenants with pending work
  GrammarMemoryStats memory;                      // the compiler's grammar memory and cache
};

using CompileResult = absl::StatusOr<std::shared_ptr<const CompiledGrammar>>;
// Work SubmitTask runs on a worker within `budget` (checked inside, e.g. by
// GrammarMatcher::NextTokenMaskWithin).
using GrammarTask = std::function<absl::Status(CompileBudget* budget)>;

namespace compile_service_internal {
struct Core;
struct Waiter;
}  // namespace compile_service_internal

// One request's wait for its grammar (GrammarCompileService::Submit). Owned by the requester;
// ready() and result() never block. Destroying it unanswered cancels it.
class GrammarCompileHandle {
 public:
  ~GrammarCompileHandle();
  GrammarCompileHandle(const GrammarCompileHandle&) = delete;
  GrammarCompileHandle& operator=(const GrammarCompileHandle&) = delete;

  // The result is set (any thread; an acquire load).
  bool ready() const;
  // The grammar, or why not: INVALID_ARGUMENT (the constraint does not compile, or it ran past
  // the CPU budget, named in the message), RESOURCE_EXHAUSTED (too many compilations pending),
  // CANCELLED (Cancel), UNAVAILABLE (the service shut down). Only once ready().
  const CompileResult& result() const;
  // Whether Submit answered it itself (a cached grammar or a refusal), without a worker.
  bool answered_in_submit() const;
  // Blocks until ready() (tests and tools; never on an engine loop).
  const CompileResult& Wait() const;
  // Stops waiting: when no other request waits for the same compilation it is abandoned (a
  // running one stops at its next budget check). After Cancel returns, the readiness callback is
  // not running and never runs; result() is CANCELLED unless it was set before.
  void Cancel();

 private:
  friend class GrammarCompileService;
  GrammarCompileHandle(std::shared_ptr<compile_service_internal::Core> core,
                       std::shared_ptr<compile_service_internal::Waiter> waiter)
      : core_(std::move(core)), waiter_(std::move(waiter)) {}

  std::shared_ptr<compile_service_internal::Core> core_;
  std::shared_ptr<compile_service_internal::Waiter> waiter_;
};

// Grammar compilation off the engine loop: a bounded pool of worker threads compiles
// constraints (GrammarCompiler: front end, parse, state graph, first mask) while the engine keeps
// stepping; a request waits for its grammar through a handle it polls.
//
// - Fair across tenants: each tenant's submissions queue behind its own; a free worker starts
//   the oldest queued compilation of the tenant served least recently (a tenant new to the
//   queue first) among those below max_running_per_tenant running compilations. A tenant has
//   at most max_pending_per_tenant answers outstanding (beyond: RESOURCE_EXHAUSTED at once), so
//   a tenant flooding large grammars delays only itself: another tenant's compilation waits at
//   most for those already running (none with the default two workers and one per tenant).
// - Budget: each compilation may use budget_ms of CPU time; past it it stops cooperatively (the
//   compiler checks inside its loops) with INVALID_ARGUMENT naming the budget, freeing its worker.
// - Deduplicated: a constraint already compiling (or queued) gets no second compile; every
//   waiter gets the one result. It stands in each waiting tenant's queue and starts on
//   whichever tenant's turn comes first.
// - Cancellable: GrammarCompileHandle::Cancel (or dropping the handle).
// - Cached: a constraint in the compiler's cache is answered inside Submit.
//
// Threads: Submit, stats and the handles from any thread, never blocking on a compile (they take
// one short lock); `threads` workers (niced) run compilations and call readiness callbacks.
class GrammarCompileService {
 public:
  GrammarCompileService(std::shared_ptr<GrammarCompiler> compiler,
                        GrammarCompileServiceOptions options = {});
  // Stops the workers (a running compilation is cancelled at its next check); handles still
  // waiting become ready with UNAVAILABLE, without callbacks.
  ~GrammarCompileService();
  GrammarCompileService(const GrammarCompileService&) = delete;
  GrammarCompileService& operator=(const GrammarCompileService&) = delete;

  // Starts compiling `constraint` for `tenant` (any string; "" is a tenant too). The handle is
  // ready at once for a cached grammar or a refusal (queue full, service stopped); then
  // `on_ready` is never called. Otherwise `on_ready` (may be empty) is called exactly once, on a
  // worker thread, right after the result is set, unless the handle was cancelled first or the
  // service shut down (its destructor answers UNAVAILABLE without callbacks). It is
  // a wake-up: it must be quick, must not block, and must not call Cancel on (or destroy) its
  // own handle; it may call ready(), result() and Submit.
  std::unique_ptr<GrammarCompileHandle> Submit(const std::string& tenant,
                                               const Constraint& constraint,
                                               std::function<void()> on_ready = nullptr);

  // Runs `task` on a worker on `tenant`'s turn (the same queues, fairness and niceness as its
  // compilations) within the service's budget_ms of CPU time: work too expensive for the
  // engine loop, e.g. a token mask of an expensive grammar. Never deduplicated, and not counted
  // against the pending bounds (the caller bounds how many it submits: the engine, one per
  // sequence). The handle's result is OK (a null grammar) when the task returned OK, else the
  // task's status; `on_ready` and cancellation as for Submit (cancelling a running task cancels
  // its budget). `what` names the work in the budget's error ("computing a token mask").
  // Refused only when the service shut down (UNAVAILABLE, ready at once).
  std::unique_ptr<GrammarCompileHandle> SubmitTask(const std::string& tenant,
                                                   const std::string& what, GrammarTask task,
                                                   std::function<void()> on_ready = nullptr);

  GrammarCompiler& compiler() const { return *compiler_; }
  const GrammarCompileServiceOptions& options() const { return options_; }
  GrammarCompileServiceStats stats() const;

 private:
  void Work();

  std::shared_ptr<GrammarCompiler> compiler_;
  GrammarCompileServiceOptions options_;
  std::shared_ptr<compile_service_internal::Core> core_;
  std::vector<std::thread> workers_;
};

}  // namespace tandem::grammar
