#pragma once

// A worker as WorkerRegistry sees it, for the registry tests: GetInfo answers its role and KV
// transport (and GPU), WatchStats sends one snapshot and stays open; served on a loopback port.

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {

class FakeRegistryWorker : public v1::Worker::CallbackService {
 public:
  FakeRegistryWorker(std::string role, std::string transport, std::string device = "")
      : role_(std::move(role)), transport_(std::move(transport)), device_(std::move(device)) {}
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const v1::InfoRequest* request,
                                    v1::WorkerInfo* response) override {
    response->set_role(role_);
    response->set_kv_transport(transport_);
    response->set_kv_device(device_);
    response->mutable_layout()->set_model_id("m");
    response->mutable_layout()->set_block_size(16);
    response->mutable_layout()->set_kv_dtype("f32");
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerWriteReactor<v1::WorkerStats>* WatchStats(grpc::CallbackServerContext* context,
                                                        const v1::StatsRequest* request) override {
    class Watch : public grpc::ServerWriteReactor<v1::WorkerStats> {
     public:
      Watch() {
        message_.set_snapshot(true);
        StartWrite(&message_);
      }
      void OnWriteDone(bool ok) override {}
      void OnCancel() override { Finish(grpc::Status::CANCELLED); }
      void OnDone() override { delete this; }

     private:
      v1::WorkerStats message_;
    };
    return new Watch;
  }

 private:
  std::string role_;
  std::string transport_;
  std::string device_;
};

// A FakeRegistryWorker on 127.0.0.1 (any free port).
struct FakeRegistryWorkerServer {
  FakeRegistryWorker service;
  std::unique_ptr<grpc::Server> server;
  std::string address;

  explicit FakeRegistryWorkerServer(std::string role = "decode", std::string transport = "",
                                    std::string device = "")
      : service(std::move(role), std::move(transport), std::move(device)) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    address = absl::StrCat("127.0.0.1:", port);
  }
  ~FakeRegistryWorkerServer() { Stop(); }
  void Stop() {
    if (!stopped_) server->Shutdown(std::chrono::system_clock::now());
    stopped_ = true;
  }

 private:
  bool stopped_ = false;
};

// True once `pred` holds, polled for up to 10 s.
template <typename Pred>
bool Eventually(Pred pred) {
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (absl::Now() < end && !pred()) absl::SleepFor(absl::Milliseconds(10));
  return pred();
}

}  // namespace tandem
