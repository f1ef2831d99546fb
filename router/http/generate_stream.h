#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "absl/time/time.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem {

// One Generate call on the router's own gRPC server (an in-process channel), read into a queue
// that the HTTP thread waits on with a timeout, so it can send keep-alives and notice a client
// that went away. Thread-safe. The destructor cancels the call and waits for its end.
class GenerateStream : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  // Starts the call; `metadata` is sent with it (authorization).
  GenerateStream(v1::Generation::Stub* stub, const v1::GenerateRequest& request,
                 const std::vector<std::pair<std::string, std::string>>& metadata);
  ~GenerateStream() override;

  enum class Next { kMessage, kDone, kTimeout };
  // The next message (kMessage), the end of the call (kDone: see status()), or kTimeout.
  Next Wait(absl::Duration timeout, v1::GenerateResponse* message);
  grpc::Status status();
  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse in_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::GenerateResponse> queue_;
  std::optional<grpc::Status> status_;
};

}  // namespace tandem
