#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/engine/async_engine.h"
#include "common/metrics/request_hooks.h"
#include "common/worker/handlers.h"
#include "common/worker/kv_event_log.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

class DecodeCall;
class WatchCall;

// Every method takes its request raw, so a malformed frame gets INVALID_ARGUMENT from
// ParseRawRequest (common/rpc) rather than gRPC's generic UNIMPLEMENTED.
using WorkerServiceBase = v1::Worker::WithRawCallbackMethod_GetInfo<
    v1::Worker::WithRawCallbackMethod_Decode<v1::Worker::WithRawCallbackMethod_Prefill<
        v1::Worker::WithRawCallbackMethod_Cancel<v1::Worker::WithRawCallbackMethod_GetStats<
            v1::Worker::WithRawCallbackMethod_WatchStats<v1::Worker::CallbackService>>>>>>;

struct WorkerServiceOptions {
  v1::WorkerInfo info;  // role, layout, endpoints: returned by GetInfo
  absl::Duration watch_interval = absl::Milliseconds(100);
};

// The gRPC service tandem.v1.Worker of one worker process, whatever its role: Decode goes to
// the DecodeHandler, Prefill to the PrefillHandler (either may be null: UNIMPLEMENTED), and
// GetInfo / GetStats / WatchStats report the engine's load and prefix-cache events.
// Thread-safe. One ticker thread feeds every WatchStats stream. `hooks` (may be null; must
// outlive the service) counts Decode and Prefill calls and the draining state: metrics.
class WorkerService final : public WorkerServiceBase {
 public:
  WorkerService(const WorkerServiceOptions& options, AsyncEngine* engine, KvEventLog* events,
                DecodeHandler* decode, PrefillHandler* prefill, WorkerHooks* hooks = nullptr);
  ~WorkerService() override;

  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Decode(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* WatchStats(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request) override;
  // LoRA adapters: LoraRegistry::Acquire (on demand, evicting the least recently used adapter
  // no request holds) and Unload; FAILED_PRECONDITION without --enable-lora.
  grpc::ServerUnaryReactor* LoadLoraAdapter(grpc::CallbackServerContext* context,
                                            const v1::WorkerLoraRequest* request,
                                            v1::LoraAdapterState* response) override;
  grpc::ServerUnaryReactor* UnloadLoraAdapter(grpc::CallbackServerContext* context,
                                              const v1::WorkerLoraRequest* request,
                                              v1::LoraAdapterState* response) override;

  // New Decode / Prefill calls fail with UNAVAILABLE from now on; running ones continue.
  void StartDrain();
  int64_t active_calls() const { return active_.load(); }
  v1::WorkerStats Stats() const;
  // Stops the watch ticker and ends watch streams (before server shutdown).
  void Stop();

 private:
  friend class DecodeCall;
  friend class WatchCall;
  void TickerLoop();
  // Every Decode and Prefill call: counted active from start to end (metrics).
  void CallStarted();
  void CallEnded(RequestOutcome outcome);

  WorkerServiceOptions options_;
  AsyncEngine* engine_;
  KvEventLog* events_;
  DecodeHandler* decode_;
  PrefillHandler* prefill_;
  WorkerHooks* hooks_;
  std::atomic<bool> draining_{false};
  std::atomic<int64_t> active_{0};

  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  std::vector<std::shared_ptr<WatchCall>> watchers_;
  bool stop_ = false;
  std::thread ticker_;
};

// EngineStats as the worker API reports them.
v1::WorkerStats ToWorkerStats(const EngineStats& stats);

}  // namespace tandem
