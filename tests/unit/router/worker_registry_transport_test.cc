// The router refuses at registration a worker whose KV transport cannot talk to the cluster's
// (every prefill worker sends to every decode worker), naming both sides; workers that agree
// are admitted.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "router/worker_registry.h"

namespace tandem {
namespace {

// A worker that answers GetInfo with its role and transport and keeps a WatchStats stream open.
class FakeWorker : public v1::Worker::CallbackService {
 public:
  FakeWorker(std::string role, std::string transport)
      : role_(std::move(role)), transport_(std::move(transport)) {}
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const v1::InfoRequest* request,
                                    v1::WorkerInfo* response) override {
    response->set_role(role_);
    response->set_kv_transport(transport_);
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
};

struct Server {
  FakeWorker service;
  std::unique_ptr<grpc::Server> server;
  std::string address;

  Server(std::string role, std::string transport) : service(role, transport) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    address = absl::StrCat("127.0.0.1:", port);
  }
  ~Server() { server->Shutdown(std::chrono::system_clock::now()); }
};

template <typename Pred>
bool Eventually(Pred pred) {
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (absl::Now() < end && !pred()) absl::SleepFor(absl::Milliseconds(10));
  return pred();
}

TEST(WorkerRegistryTransportTest, RefusesAMismatchNamingBothSides) {
  Server decode("decode", "nccl");
  Server prefill("prefill", "tcp");
  RegistryOptions o2;
  o2.decode_addresses = {decode.address};
  o2.prefill_addresses = {prefill.address};
  o2.resolve_interval = absl::Milliseconds(50);
  WorkerRegistry both(o2);
  both.Start();
  ASSERT_TRUE(Eventually([&] { return !both.refused().empty(); }));
  const std::string refusal = both.refused().front();
  // Whichever registered second is refused; both transports and both addresses are named.
  EXPECT_NE(refusal.find("KV transport mismatch"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("'nccl'"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("'tcp'"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find(decode.address), std::string::npos) << refusal;
  EXPECT_NE(refusal.find(prefill.address), std::string::npos) << refusal;
  EXPECT_EQ(both.All().size(), 1u);
  both.Stop();
}

TEST(WorkerRegistryTransportTest, AdmitsWorkersThatAgree) {
  Server decode("decode", "nccl");
  Server prefill("prefill", "nccl");
  RegistryOptions o;
  o.decode_addresses = {decode.address};
  o.prefill_addresses = {prefill.address};
  o.resolve_interval = absl::Milliseconds(50);
  WorkerRegistry registry(o);
  registry.Start();
  EXPECT_TRUE(registry.WaitForWorkers(1, 1, absl::Seconds(10)));
  EXPECT_TRUE(registry.refused().empty());
  registry.Stop();
}

}  // namespace
}  // namespace tandem
