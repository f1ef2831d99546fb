#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "nlohmann/json.hpp"
#include "tools/bench/report.h"

namespace tandem::bench {
namespace {

CallResult Done(int64_t index, double start, double ttft, double e2e, int32_t tokens) {
  CallResult r;
  r.index = index;
  r.prompt_tokens = 10;
  r.max_tokens = tokens;
  r.output_tokens = tokens;
  r.start_s = start;
  r.ttft_s = ttft;
  r.e2e_s = e2e;
  for (int i = 1; i < tokens; ++i) r.itl_s.push_back((e2e - ttft) / (tokens - 1));
  r.ok = true;
  return r;
}

// Sets a field by name when this build's proto has it (newer servers split remote prefills).
bool SetIfPresent(google::protobuf::Message* m, const char* name, double value) {
  const auto* f = m->GetDescriptor()->FindFieldByName(name);
  if (f == nullptr) return false;
  if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_BOOL) {
    m->GetReflection()->SetBool(m, f, value != 0);
  } else {
    m->GetReflection()->SetDouble(m, f, value);
  }
  return true;
}

TEST(BenchReportTest, ThroughputAndLatencies) {
  RunDescription run;
  run.block_size = 16;
  run.max_model_len = 256;
  std::vector<CallResult> results = {Done(0, 0.0, 0.1, 1.1, 11), Done(1, 0.5, 0.2, 1.5, 11)};
  CallResult cancelled = Done(2, 1.0, 0.1, 0.5, 3);
  cancelled.ok = false;
  cancelled.cancelled = true;
  results.push_back(cancelled);
  CallResult failed;
  failed.index = 3;
  failed.start_s = 1.0;
  failed.e2e_s = 0.01;
  failed.error = "UNAVAILABLE: gone";
  results.push_back(failed);

  const BenchReport r = BuildReport(run, results, {}, "");
  EXPECT_EQ(r.issued, 4);
  EXPECT_EQ(r.completed, 2);
  EXPECT_EQ(r.cancelled, 1);
  EXPECT_EQ(r.failed, 1);
  EXPECT_EQ(r.errors.at("UNAVAILABLE: gone"), 1);
  EXPECT_DOUBLE_EQ(r.duration_s, 2.0);  // 0 -> 0.5 + 1.5
  EXPECT_EQ(r.output_tokens, 25);
  EXPECT_EQ(r.prompt_tokens, 30);  // completed and cancelled requests
  EXPECT_DOUBLE_EQ(r.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(r.output_throughput, 12.5);
  EXPECT_DOUBLE_EQ(r.total_throughput, 27.5);
  EXPECT_EQ(r.ttft.count, 3);
  EXPECT_EQ(r.e2e.count, 2);
  EXPECT_NEAR(r.tpot.mean, (0.1 + 0.13) / 2, 1e-12);
  EXPECT_EQ(r.itl.count, 10 + 10 + 2);
}

TEST(BenchReportTest, ThroughputWhileIssuing) {
  RunDescription run;
  LoadWindow window;
  window.seconds = 4;
  window.output_tokens = 30;
  const BenchReport r = BuildReport(run, {Done(0, 0, 0.1, 5, 40)}, {}, "", window);
  EXPECT_DOUBLE_EQ(r.window_output_throughput, 7.5);
  EXPECT_DOUBLE_EQ(r.output_throughput, 8);  // over the whole run, drain included
}

TEST(BenchReportTest, ServerTtftSplit) {
  RunDescription run;
  CallResult local = Done(0, 0, 0.5, 1, 2);
  local.has_final = true;
  v1::Timings* t = local.final.mutable_timings();
  t->set_queue_s(0.1);
  t->set_prefill_s(0.3);
  t->set_time_to_first_token_s(0.45);
  CallResult remote = Done(1, 0, 0.9, 2, 2);
  remote.has_final = true;
  v1::Timings* rt = remote.final.mutable_timings();
  rt->set_queue_s(0.05);
  rt->set_prefill_s(0.7);
  rt->set_time_to_first_token_s(0.8);
  const bool has_remote_fields = SetIfPresent(rt, "remote", 1) &&
                                 SetIfPresent(rt, "remote_prefill_s", 0.5) &&
                                 SetIfPresent(rt, "kv_transfer_s", 0.15);

  const BenchReport r = BuildReport(run, {local}, {}, "");
  EXPECT_EQ(r.split.requests, 1);
  EXPECT_EQ(r.split.remote, 0);
  EXPECT_NEAR(r.split.prefill.mean, 0.3, 1e-12);
  EXPECT_NEAR(r.split.first_decode.mean, 0.05, 1e-12);
  EXPECT_NEAR(r.split.client_overhead.mean, 0.05, 1e-12);
  if (!has_remote_fields) GTEST_SKIP() << "this proto has no remote prefill timings";
  const BenchReport rr = BuildReport(run, {remote}, {}, "");
  EXPECT_EQ(rr.split.remote, 1);
  EXPECT_NEAR(rr.split.prefill.mean, 0.5, 1e-12);
  EXPECT_NEAR(rr.split.kv_transfer.mean, 0.15, 1e-12);
  EXPECT_NEAR(rr.split.first_decode.mean, 0.1, 1e-12);
}

TEST(BenchReportTest, KvWasteFromStepsAndSamples) {
  RunDescription run;
  run.block_size = 16;
  run.max_model_len = 64;
  CallResult r = Done(0, 0, 0.1, 1, 4);
  r.prompt_tokens = 16;
  OccupancySample s;
  s.model.filled = 90;
  s.model.paged = 100;
  s.model.static_reservation = 200;
  s.model.max_len = 300;
  s.model_sequences = 2;
  s.has_server = true;
  s.running = 2;
  s.kv_blocks_used = 7;
  s.kv_blocks_total = 100;
  s.reserved_slots = 112;
  s.filled_slots = 100;
  const BenchReport report = BuildReport(run, {r}, {s, s}, "");
  // Steps: filled 16+17+18+19 = 70 of paged 112, static 128, max-len 256.
  EXPECT_NEAR(report.kv.steps_paged, 42.0 / 112, 1e-12);
  EXPECT_NEAR(report.kv.steps_static, 58.0 / 128, 1e-12);
  EXPECT_NEAR(report.kv.steps_max_len, 186.0 / 256, 1e-12);
  EXPECT_EQ(report.kv.samples, 2);
  EXPECT_NEAR(report.kv.sampled_paged, 0.1, 1e-12);
  EXPECT_NEAR(report.kv.sampled_static, 0.55, 1e-12);
  EXPECT_NEAR(report.kv.sampled_max_len, 0.7, 1e-12);
  EXPECT_NEAR(report.kv.server_waste, 12.0 / 112, 1e-12);
  EXPECT_NEAR(report.kv.server_blocks_waste, 22.0 / 112, 1e-12);  // 7 blocks of 16, 90 filled
  EXPECT_EQ(report.kv.max_blocks_used, 7);
  EXPECT_DOUBLE_EQ(report.kv.mean_sequences, 2);
}

TEST(BenchReportTest, OccupancyWhileIssuingLeavesOutTheDrain) {
  RunDescription run;
  run.block_size = 16;
  std::vector<OccupancySample> samples;
  // Full concurrency for the first 4 s (two samples at the window's edge included), then the
  // drain: 16, 16, 16 running up to t = 4, then 8 and 2 after it.
  for (const auto& [t, running, waiting] : std::vector<std::tuple<double, int, int>>{
           {1, 16, 2}, {2.5, 16, 0}, {4, 16, 1}, {5, 8, 0}, {6, 2, 0}}) {
    OccupancySample s;
    s.t_s = t;
    s.has_server = true;
    s.running = running;
    s.waiting = waiting;
    s.steps = static_cast<int64_t>(t * 10);  // 10 steps a second
    s.generated_tokens = static_cast<int64_t>(t * 10) * running;
    samples.push_back(s);
  }
  LoadWindow window;
  window.seconds = 4;
  const BenchReport r = BuildReport(run, {Done(0, 0, 0.1, 5, 40)}, samples, "", window);
  EXPECT_DOUBLE_EQ(r.kv.mean_running, 58.0 / 5);
  EXPECT_EQ(r.kv.server_samples_while_issuing, 3);
  EXPECT_DOUBLE_EQ(r.kv.mean_running_while_issuing, 16);
  EXPECT_DOUBLE_EQ(r.kv.mean_waiting_while_issuing, 1);
  // Samples at t = 1 and t = 4 bound the window: (640 - 160) tokens over (40 - 10) steps.
  EXPECT_DOUBLE_EQ(r.kv.tokens_per_step_while_issuing, 16);
  const std::string json = ReportToJson(r);
  EXPECT_NE(json.find("\"mean_running_while_issuing\": 16"), std::string::npos) << json;
  // No window (a --num-requests run): nothing is reported as "while issuing".
  const BenchReport no_window = BuildReport(run, {Done(0, 0, 0.1, 5, 40)}, samples, "");
  EXPECT_EQ(no_window.kv.server_samples_while_issuing, 0);
  EXPECT_DOUBLE_EQ(no_window.kv.mean_running_while_issuing, 0);
  EXPECT_DOUBLE_EQ(no_window.kv.tokens_per_step_while_issuing, -1);
}

TEST(BenchReportTest, JsonHasTheHeadlineFields) {
  RunDescription run;
  run.label = "smoke";
  const BenchReport r = BuildReport(run, {Done(0, 0, 0.1, 1.1, 11)}, {}, "");
  const auto j = nlohmann::json::parse(ReportToJson(r));
  EXPECT_EQ(j["label"], "smoke");
  EXPECT_EQ(j["requests"]["completed"], 1);
  EXPECT_NEAR(j["throughput"]["output_tokens_per_s"].get<double>(), 10, 1e-9);
  EXPECT_NEAR(j["ttft_ms"]["p50"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(j["itl_ms"]["mean"].get<double>(), 100, 1e-9);
  EXPECT_TRUE(j["kv_waste"]["server"]["waste"].is_null());
}

}  // namespace
}  // namespace tandem::bench
