// WorkerRegistry reports each worker's health to RouterHooks (read back from RouterMetrics):
// 0 at registration, 1 once its stats stream is up, 0 when the stream breaks or a call fails.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics/metric_reader.h"
#include "common/metrics/router_metrics.h"
#include "router/worker_registry.h"

namespace tandem {
namespace {

// A worker that answers GetInfo and keeps a WatchStats stream open after one message.
class FakeWorker : public v1::Worker::CallbackService {
 public:
  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* context,
                                    const v1::InfoRequest* request,
                                    v1::WorkerInfo* response) override {
    response->set_role("decode");
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
};

struct Server {
  FakeWorker service;
  std::unique_ptr<grpc::Server> server;
  std::string address;

  Server() {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    address = absl::StrCat("127.0.0.1:", port);
  }
  void Stop() { server->Shutdown(std::chrono::system_clock::now()); }
};

template <typename Pred>
bool Eventually(Pred pred) {
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (absl::Now() < end && !pred()) absl::SleepFor(absl::Milliseconds(10));
  return pred();
}

TEST(WorkerRegistryMetricsTest, HealthFollowsTheStatsStream) {
  prometheus::Registry metrics_registry;
  RouterMetrics metrics(&metrics_registry);
  Server a, b;
  RegistryOptions o;
  o.decode_addresses = {a.address, b.address};
  o.resolve_interval = absl::Milliseconds(50);
  o.hooks = &metrics;
  WorkerRegistry registry(o);
  registry.Start();
  ASSERT_TRUE(registry.WaitForWorkers(0, 2, absl::Seconds(10)));
  auto healthy = [&](const std::string& worker) {
    return ReadMetric(metrics_registry, "tandem_router_worker_healthy",
                      {{"worker", worker}, {"role", "decode"}});
  };
  EXPECT_TRUE(Eventually([&] { return healthy(a.address) == 1 && healthy(b.address) == 1; }));
  EXPECT_EQ(ReadMetric(metrics_registry, "tandem_router_worker_healthy"), 2);

  a.Stop();  // the stream breaks: unhealthy, and stays so while it cannot re-register
  EXPECT_TRUE(Eventually([&] { return healthy(a.address) == 0; }));
  EXPECT_EQ(healthy(b.address), 1);

  registry.ReportFailure(registry.Healthy("decode").front());  // a call to b failed
  EXPECT_EQ(healthy(b.address), 0);
  // Discovery re-registers b (its server is up): healthy again.
  EXPECT_TRUE(Eventually([&] { return healthy(b.address) == 1; }));
  EXPECT_EQ(healthy(a.address), 0);
  registry.Stop();
  b.Stop();
}

}  // namespace
}  // namespace tandem
