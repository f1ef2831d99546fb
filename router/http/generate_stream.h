#pragma once

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "tandem/v1/generation.grpc.pb.h"

namespace tandem {

// One Generate call on the router's own gRPC server (an in-process channel), read into a queue
// that the HTTP layer drains when `notify` says something arrived. Owns itself until the call
// ends, so dropping it never waits: call Cancel() first for a client that went away.
// Thread-safe.
class GenerateStream : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  // Starts the call; `metadata` is sent with it (authorization). `notify` runs on a gRPC thread
  // after each message and after the end; it must not block.
  static std::shared_ptr<GenerateStream> Start(
      v1::Generation::Stub* stub, const v1::GenerateRequest& request,
      const std::vector<std::pair<std::string, std::string>>& metadata,
      std::function<void()> notify);

  enum class Next { kMessage, kDone, kNone };
  // The next message (kMessage), the end of the call (kDone: see status()), or nothing yet.
  Next Poll(v1::GenerateResponse* message);
  grpc::Status status();
  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  GenerateStream(const v1::GenerateRequest& request, std::function<void()> notify)
      : request_(request), notify_(std::move(notify)) {}

  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse in_;
  const std::function<void()> notify_;
  std::shared_ptr<GenerateStream> self_;  // until OnDone
  std::mutex mu_;
  std::deque<v1::GenerateResponse> queue_;
  std::optional<grpc::Status> status_;
};

}  // namespace tandem
