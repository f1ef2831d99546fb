#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/rpc/write_queue.h"
#include "common/tokenizer/stream_decoder.h"
#include "router/generation_service.h"
#include "router/stop_matcher.h"

namespace tandem {

// One Generate stream: validation and tokenization, the worker request, incremental
// detokenization and stop strings per sample, and the write queue of the gRPC reactor.
//
// Threads: the reactor's callbacks (OnWriteDone, OnCancel, OnDone) run on gRPC threads; worker
// responses arrive on the client's thread. `mu_` guards everything below it. Only the holder
// of the "writer" role (common/rpc/write_queue.h) calls StartWrite or Finish, so the reactor
// cannot be deleted (OnDone) while a response is being handed to it.
class GenerateCall : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                     public std::enable_shared_from_this<GenerateCall> {
 public:
  static grpc::ServerWriteReactor<grpc::ByteBuffer>* Start(GenerationService* service,
                                                           grpc::CallbackServerContext* context,
                                                           const grpc::ByteBuffer* raw_request);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  struct Sample {
    std::unique_ptr<StreamDecoder> decoder;
    std::unique_ptr<StopMatcher> stop;
    int32_t tokens = 0;
    bool stopped_by_string = false;  // finished here; the worker's final is still awaited
    bool done = false;               // final sent
  };

  GenerateCall(GenerationService* service, grpc::CallbackServerContext* context);
  grpc::Status Prepare(const v1::GenerateRequest& request, v1::DecodeRequest* decode);
  void OnWorkerResponse(const v1::DecodeResponse& response);
  void HandleTokens(const v1::SampleTokens& tokens);
  void HandleFinal(const v1::SampleFinal& final);
  // Queues a message (and starts writing when idle). Requires mu_ held via `lock`.
  void Enqueue(std::unique_lock<std::mutex>& lock, v1::GenerateResponse message);
  void FinishCall(std::unique_lock<std::mutex>& lock, grpc::Status status);
  void PumpLocked(std::unique_lock<std::mutex>& lock);
  // Sets the call's final status once: metrics and the "finished" log line. Requires mu_.
  void SetFinishStatusLocked(grpc::Status status);

  GenerationService* service_;
  grpc::CallbackServerContext* context_;
  // The tenant's name, "" without API keys: the namespace of client-chosen request ids.
  const std::string& TenantName() const;

  std::string request_id_;   // the client's (or, when it chose none, worker_id_)
  std::string worker_id_;    // what the workers know the call by: random, unique per call
  bool id_claimed_ = false;  // request_id_ is claimed in the service until OnDone
  std::vector<int32_t> prompt_ids_;
  bool echo_prompt_ids_ = false;
  bool skip_special_tokens_ = true;

  std::mutex mu_;
  std::vector<Sample> samples_;
  int32_t samples_open_ = 0;
  WriteQueue<v1::GenerateResponse> writes_;
  std::optional<grpc::Status> finish_status_;  // set once the stream should end
  bool sent_first_ = false;
  std::shared_ptr<GenerateCall> self_;  // keeps the call alive until OnDone
  absl::Time arrival_;
  std::unique_ptr<RequestHooks> hooks_;   // metrics; null without a factory
  std::string last_finish_reason_;        // of the last sample to finish
  std::shared_ptr<const Tenant> tenant_;  // with API keys: whose request this is
  bool admitted_ = false;                 // counted by the tenant's limits; released once
};

}  // namespace tandem
