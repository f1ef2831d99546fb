// RequestFlow / DecodeLeg against fake prefill and decode workers (in-process gRPC servers): the
// leg relays the decode worker's final as it comes, with the TTFT split the decode worker put in
// it (the split travels with the KV, not with the Prefill response), even while the Prefill
// call is still out; the flow and its leg are freed afterwards.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "router/cluster_client.h"
#include "router/worker_registry.h"

namespace tandem {
namespace {

constexpr double kPrefillS = 0.5;
constexpr double kTransferS = 0.25;

// What the two fakes tell each other, so that the test fixes the order of the decode worker's
// final and the Prefill response.
struct Script {
  absl::Notification prefill_called;  // the prefill worker got the Prefill call
  absl::Notification decode_done;     // the decode worker sent its final and ended the stream
  absl::Time decode_done_at;
  absl::Duration prefill_delay;  // after decode_done, before answering Prefill
};

class FakeWorker : public v1::Worker::Service {
 public:
  FakeWorker(std::string role, Script* script) : role_(std::move(role)), script_(script) {}

  grpc::Status GetInfo(grpc::ServerContext*, const v1::InfoRequest*,
                       v1::WorkerInfo* info) override {
    info->set_role(role_);
    info->mutable_layout()->set_model_id("m");
    info->mutable_layout()->set_block_size(16);
    info->mutable_layout()->set_kv_dtype("f32");
    info->set_incarnation(1);
    return grpc::Status::OK;
  }

  grpc::Status WatchStats(grpc::ServerContext* context, const v1::StatsRequest*,
                          grpc::ServerWriter<v1::WorkerStats>* writer) override {
    v1::WorkerStats s;
    s.set_snapshot(true);
    writer->Write(s);
    while (!context->IsCancelled()) absl::SleepFor(absl::Milliseconds(5));
    return grpc::Status::CANCELLED;
  }

  // Decode role: the reservation, then (once the Prefill call reached the prefill worker) the
  // first token and the final, at once: the final leaves before the Prefill response.
  grpc::Status Decode(grpc::ServerContext* context, const v1::DecodeRequest* request,
                      grpc::ServerWriter<v1::DecodeResponse>* writer) override {
    EXPECT_TRUE(request->remote_prefill());
    v1::DecodeResponse r;
    v1::KvReservation* res = r.mutable_reservation();
    res->set_transfer_id(7);
    res->set_kv_endpoint("127.0.0.1:1");
    res->set_num_tokens(request->prompt_token_ids_size());
    writer->Write(r);
    if (!script_->prefill_called.WaitForNotificationWithTimeout(absl::Seconds(10))) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "no Prefill call");
    }
    r.Clear();
    r.mutable_tokens()->set_index(0);
    r.mutable_tokens()->add_token_ids(42);
    writer->Write(r);
    r.Clear();
    v1::SampleFinal* f = r.mutable_final();
    f->set_index(0);
    f->set_finish_reason(v1::FINISH_REASON_LENGTH);
    f->mutable_timings()->set_queue_s(0.01);
    f->mutable_timings()->set_prefill_s(0.9);
    f->mutable_timings()->set_time_to_first_token_s(1.0);
    f->mutable_timings()->set_remote(true);
    f->mutable_timings()->set_remote_prefill_s(kPrefillS);
    f->mutable_timings()->set_kv_transfer_s(kTransferS);
    writer->Write(r);
    script_->decode_done_at = absl::Now();
    script_->decode_done.Notify();
    return grpc::Status::OK;
  }

  grpc::Status Prefill(grpc::ServerContext* context, const v1::PrefillRequest* request,
                       v1::PrefillResponse* response) override {
    EXPECT_EQ(request->target().transfer_id(), 7u);
    script_->prefill_called.Notify();
    script_->decode_done.WaitForNotificationWithTimeout(absl::Seconds(10));
    const absl::Time until = absl::Now() + script_->prefill_delay;
    while (absl::Now() < until) {
      if (context->IsCancelled()) return grpc::Status::CANCELLED;
      absl::SleepFor(absl::Milliseconds(5));
    }
    response->add_first_token_ids(42);
    // Other numbers than the decode worker's: the router must not mix them in.
    response->set_prefill_s(7 * kPrefillS);
    response->set_transfer_s(7 * kTransferS);
    return grpc::Status::OK;
  }

  grpc::Status Cancel(grpc::ServerContext*, const v1::CancelRequest*,
                      v1::CancelResponse*) override {
    return grpc::Status::OK;
  }

 private:
  std::string role_;
  Script* script_;
};

struct Server {
  FakeWorker service;
  std::unique_ptr<grpc::Server> server;
  std::string address;

  Server(std::string role, Script* script) : service(std::move(role), script) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    address = absl::StrCat("127.0.0.1:", port);
  }
  ~Server() { server->Shutdown(std::chrono::system_clock::now()); }
};

// What the client got from one request.
struct Result {
  std::vector<v1::DecodeResponse> responses;
  absl::Duration final_after_decode;  // from the decode worker's end of stream to the final
  int64_t remote_prefills = 0, migrations = 0, failures = 0, prefill_retries = 0;
};

// One disaggregated request through a ClusterClient over the fakes: the decode worker's final
// leaves before the Prefill response, which comes `prefill_delay` later.
Result RunOne(absl::Duration prefill_delay) {
  Result result;
  Script script;
  script.prefill_delay = prefill_delay;
  Server prefill("prefill", &script);
  Server decode("decode", &script);
  RegistryOptions ro;
  ro.prefill_addresses = {prefill.address};
  ro.decode_addresses = {decode.address};
  ro.resolve_interval = absl::Milliseconds(50);
  WorkerRegistry registry(ro);
  registry.Start();
  EXPECT_TRUE(registry.WaitForWorkers(1, 1, absl::Seconds(10)));
  ClusterOptions co;
  co.disagg_min_uncached_tokens = 1;
  {
    ClusterClient client(&registry, co);
    v1::DecodeRequest request;
    request.set_request_id("r1");
    for (int i = 0; i < 40; ++i) request.add_prompt_token_ids(3 + i);
    request.mutable_sampling()->set_max_tokens(1);
    request.set_n(1);
    std::mutex mu;
    std::condition_variable cv;
    absl::Time final_at;
    // Held by the flow through its callback: gone once the flow and its legs are freed.
    auto token = std::make_shared<int>(0);
    std::weak_ptr<int> flow_alive = token;
    client.Decode(request, [&, token](const v1::DecodeResponse& r) {
      std::lock_guard<std::mutex> lock(mu);
      result.responses.push_back(r);
      if (r.has_final()) final_at = absl::Now();
      cv.notify_all();
    });
    {
      std::unique_lock<std::mutex> lock(mu);
      EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] {
        return !result.responses.empty() && result.responses.back().has_final();
      }));
    }
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (client.active_requests() > 0 && absl::Now() < end) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_EQ(client.active_requests(), 0) << "the flow did not end";
    token.reset();
    while (!flow_alive.expired() && absl::Now() < end) absl::SleepFor(absl::Milliseconds(5));
    EXPECT_TRUE(flow_alive.expired()) << "the flow or its leg is never freed";
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_TRUE(script.decode_done.HasBeenNotified());
    result.final_after_decode = final_at - script.decode_done_at;
    result.remote_prefills = client.counters().remote_prefills.load();
    result.migrations = client.counters().migrations.load();
    result.failures = client.counters().failures.load();
    result.prefill_retries = client.counters().prefill_retries.load();
  }
  registry.Stop();
  return result;
}

// The final is relayed at once, with the decode worker's split, although the Prefill response
// would come only 30 s later (the leg's end cancels that call).
TEST(RequestFlowTest, TheFinalIsRelayedAtOnceWithTheDecodeWorkersSplit) {
  const Result r = RunOne(absl::Seconds(30));
  ASSERT_EQ(r.responses.size(), 2u);
  ASSERT_TRUE(r.responses[0].has_tokens());
  EXPECT_EQ(r.responses[0].tokens().token_ids(0), 42);
  ASSERT_TRUE(r.responses[1].has_final());
  const v1::SampleFinal& f = r.responses[1].final();
  EXPECT_EQ(f.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_TRUE(f.timings().remote());
  EXPECT_DOUBLE_EQ(f.timings().remote_prefill_s(), kPrefillS);
  EXPECT_DOUBLE_EQ(f.timings().kv_transfer_s(), kTransferS);
  EXPECT_DOUBLE_EQ(f.timings().prefill_s(), 0.9);
  EXPECT_LT(r.final_after_decode, absl::Milliseconds(250)) << "the final was held";
  EXPECT_EQ(r.remote_prefills, 1);
  EXPECT_EQ(r.migrations, 0);
  EXPECT_EQ(r.failures, 0);
  EXPECT_EQ(r.prefill_retries, 0) << "the decode worker had the KV: no retry";
}

// A Prefill response that comes after the final (here 100 ms) changes nothing in it.
TEST(RequestFlowTest, APrefillResponseAfterTheFinalChangesNothing) {
  const Result r = RunOne(absl::Milliseconds(100));
  ASSERT_EQ(r.responses.size(), 2u);
  ASSERT_TRUE(r.responses[1].has_final());
  const v1::SampleFinal& f = r.responses[1].final();
  EXPECT_EQ(f.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_DOUBLE_EQ(f.timings().remote_prefill_s(), kPrefillS);
  EXPECT_DOUBLE_EQ(f.timings().kv_transfer_s(), kTransferS);
  EXPECT_LT(r.final_after_decode, absl::Milliseconds(250)) << "the final was held";
  EXPECT_EQ(r.migrations, 0);
  EXPECT_EQ(r.failures, 0);
  EXPECT_EQ(r.prefill_retries, 0);
}

}  // namespace
}  // namespace tandem
