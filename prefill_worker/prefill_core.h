#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/engine/async_engine.h"
#include "common/worker/handlers.h"
#include "kvtransfer/transport.h"

namespace tandem {

// The prefill role behind the worker API (DESIGN §2 step 3): runs the prompt as a
// prefill-only engine request and pushes its KV into the decode worker's reservation layer by
// layer while the remaining layers compute, then the first tokens; answers once the decode
// worker has verified the transfer, and only then releases the blocks.
//
// Threads: the engine thread calls the export hook for each finished layer and only queues it;
// one export thread talks to the KV sender (connecting may block, the engine never does);
// sender completions run on transport threads. Thread-safe.
class PrefillCore : public PrefillHandler {
 public:
  // layerwise: push each layer as soon as it is computed (default); false sends every layer
  // after the prompt is done (the baseline layer-wise push is measured against). zero_copy
  // (--kv-zero-copy auto): a cuda-ipc target's KV is written by the engine straight into the
  // decode worker's blocks (README "Zero-copy"), where the transport allows it.
  PrefillCore(AsyncEngine* engine, int64_t block_size, bool layerwise = true,
              bool zero_copy = true);
  ~PrefillCore() override;

  absl::Status StartSender(const kvtransfer::SenderOptions& options,
                           kvtransfer::KvRegionAccess* regions);
  // A sender made elsewhere (tests: a scripted one) speaking `transport`.
  void StartSender(std::unique_ptr<kvtransfer::KvSender> sender, const std::string& transport);

  void Prefill(const v1::PrefillRequest& request, DoneCallback done) override;
  void Cancel(const std::string& request_id) override;
  int64_t transfers_in_flight() const override;
  // A transfer's time to reach the decode worker: from its first layer (copying), or from before
  // the prompt's first chunk (zero-copy: past it the engine request is cancelled, and the
  // transport's own deadline comes 10 s later). Before the first Prefill (tests shorten it).
  void set_transfer_time(absl::Duration t) { transfer_time_ = t; }

 private:
  struct Job;
  struct Task {
    std::shared_ptr<Job> job;
    int64_t layer = -1;           // >= 0: send this layer
    std::vector<int32_t> blocks;  // the sequence's block table (first layer task)
    bool finish = false;          // send the trailer and wait for the ACK
    bool cleanup = false;         // the job ended: abort its transfer if still open
    bool begin = false;           // zero-copy: Begin, then submit the engine request
  };
  // The target's window (v1::KvReservation::window_layers / window_first) against this
  // worker's model: INVALID_ARGUMENT naming the field when they differ.
  absl::Status CheckTargetWindow(const v1::KvReservation& target, int64_t num_tokens) const;
  void ExportLoop();
  void RunTask(Task& task);
  void SendLayerNow(Task& task);  // export thread: Begin on first use, then SendLayer
  // The transfer's target (copying, unless zero_copy), from the job's reservation.
  kvtransfer::TransferTarget MakeTarget(const Job& job, bool zero_copy) const;
  // Export thread: Begin a zero-copy transfer and submit the engine request writing into its
  // destination; the copying request where the transport refuses zero-copy (UNIMPLEMENTED).
  void BeginZeroCopy(const std::shared_ptr<Job>& job);
  void Submit(const std::shared_ptr<Job>& job);            // mu_ held
  void NothingSubmitted(const std::shared_ptr<Job>& job);  // a job failed before its request
  // Zero-copy jobs whose engine request still computes past their deadline (mu_ held).
  std::vector<std::shared_ptr<Job>> ExpiredLocked(absl::Time now) const;
  // OK when the sender speaks `transport` (a target's kv_transport; empty: its only one).
  absl::Status CheckTargetTransport(const std::string& transport) const;
  void OnEngineUpdate(const std::shared_ptr<Job>& job, const SequenceUpdate& u);
  void Complete(const std::shared_ptr<Job>& job, absl::Status status);
  void Enqueue(Task task);

  AsyncEngine* engine_;
  int64_t block_size_;
  bool layerwise_;
  bool zero_copy_;
  absl::Duration transfer_time_ = absl::Seconds(30);
  std::unique_ptr<kvtransfer::KvSender> sender_;
  std::vector<std::string> transports_;  // the sender's (SpokenKvTransports)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  std::unordered_map<std::string, std::shared_ptr<Job>> jobs_;
  bool stop_ = false;
  std::thread export_thread_;
};

}  // namespace tandem
