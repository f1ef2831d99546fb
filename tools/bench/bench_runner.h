#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/bench/report.h"
#include "tools/bench/workload.h"

namespace tandem::bench {

struct BenchOptions {
  std::string label;
  std::string target = "127.0.0.1:50051";
  std::string model;  // empty: the server's first model
  // Closed loop: keep `concurrency` requests in flight. With request_rate > 0: start requests
  // as a Poisson process at that rate, at most `concurrency` in flight (0: no cap).
  int64_t concurrency = 8;
  double request_rate = 0;
  // When to stop issuing: after num_requests, or after duration_s (whichever is set; both:
  // whichever comes first). Requests in flight then run to their end.
  int64_t num_requests = 0;
  double duration_s = 0;
  // With duration_s: cancel the requests still in flight when it ends (counted as cut), instead
  // of letting them finish.
  bool cut_at_end = false;
  // Requests run (at the same load) before measuring; their results are dropped.
  int64_t warmup_requests = 0;
  // vocab_size and max_model_len are taken from the server's ListModels when 0.
  WorkloadOptions workload;
  bool ignore_eos = true;
  float temperature = 0;
  double connect_timeout_s = 10;
  double request_timeout_s = 600;
  double progress_interval_s = 1;  // stderr progress line; 0: off
  double sample_interval_s = 0.5;  // occupancy samples; 0: off
  // Worker API addresses for Worker.GetStats; empty: the target itself (`tandem serve`).
  std::vector<std::string> stats_targets;
  int64_t block_size = 16;  // of the server's KV pool, for the KV waste model
};

// Runs the benchmark against a Tandem server (Generation API over gRPC). Errors: UNAVAILABLE
// when the server cannot be reached, NOT_FOUND when the model is not served,
// INVALID_ARGUMENT for bad options. Failed requests are counted in the report, not errors.
absl::StatusOr<BenchReport> RunBench(const BenchOptions& options);

}  // namespace tandem::bench
