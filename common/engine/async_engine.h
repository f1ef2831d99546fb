#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/engine/engine.h"
#include "common/engine/engine_hooks.h"

namespace tandem {

// Runs an Engine on its own thread (DESIGN §3 thread model): callers on any thread submit
// requests and cancellations into an ingress queue; the engine thread drains it before every
// step, runs the step, and hands each SequenceUpdate to the request's callback. With nothing to
// compute it sleeps until a command arrives, a feature signals that a waiting sequence is ready
// (Engine::set_wake_listener) or the engine's next deadline passes.
//
// Callbacks run ON THE ENGINE THREAD and must not block (queue the update and return).
// Every submitted request gets exactly n finished updates (or one error update when it is
// rejected), after which its callback is dropped.
class AsyncEngine {
 public:
  using Callback = std::function<void(const SequenceUpdate&)>;

  // `hooks` (may be null, must outlive this) hears every step and finished sequence: metrics.
  explicit AsyncEngine(std::unique_ptr<Engine> engine, EngineHooks* hooks = nullptr);
  ~AsyncEngine();  // aborts what is left and joins the thread
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  void Submit(EngineRequest request, Callback callback);
  void Cancel(const std::string& request_id);
  // Finishes one sample (e.g. a stop string matched by the caller).
  void FinishSequence(const std::string& request_id, int32_t index, FinishReason reason);
  // Runs `fn` on the engine thread between steps and waits for it (tests, KV import/export).
  void RunOnEngineThread(const std::function<void(Engine&)>& fn);
  // Queues `fn` to run on the engine thread between steps; returns at once. For transport
  // threads that must never wait on the engine (e.g. a KV transfer completed).
  void Post(std::function<void(Engine&)> fn);

  // Snapshot of the engine's counters, refreshed after every step.
  EngineStats stats() const;
  int64_t num_active_requests() const { return active_.load(); }
  const Engine& engine() const { return *engine_; }

  // Aborts every request (their callbacks get kAbort updates) and stops the thread.
  void Shutdown();

 private:
  struct Command {
    enum Kind { kSubmit, kCancel, kFinish, kRun, kPost };
    explicit Command(Kind k) : kind(k) {}
    Kind kind;
    EngineRequest request;
    Callback callback;
    std::string request_id;
    int32_t index = 0;
    FinishReason reason = FinishReason::kNone;
    const std::function<void(Engine&)>* fn = nullptr;
    std::function<void(Engine&)> posted;
    std::shared_ptr<std::promise<void>> done;
  };
  struct Pending {
    Callback callback;
    int32_t remaining = 1;  // finished updates still expected
  };
  void Loop();
  void Push(Command command);
  void ApplyCommands(std::deque<Command>& commands);
  void Deliver(const SequenceUpdate& update);
  // Reports a finished sequence to the hooks and the log.
  void OnFinished(const SequenceUpdate& update);

  std::unique_ptr<Engine> engine_;
  EngineHooks* hooks_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Command> ingress_;
  bool stop_ = false;
  bool woken_ = false;  // a feature signalled readiness (Engine::set_wake_listener)
  EngineStats stats_;
  std::atomic<int64_t> active_{0};
  std::unordered_map<std::string, Pending> pending_;  // engine thread only
  std::thread thread_;
};

}  // namespace tandem
