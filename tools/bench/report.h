#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "tools/bench/occupancy_sampler.h"
#include "tools/bench/stream_call.h"
#include "tools/bench/summary_stats.h"

namespace tandem::bench {

// The part of the run during which requests were being issued (the load was applied): from
// the first request to the moment the last one was issued (or --duration ran out), and the
// output tokens received by then. Throughput over it leaves out the final drain, when fewer
// and fewer requests are left in flight.
struct LoadWindow {
  double seconds = 0;
  int64_t output_tokens = 0;
};

// What the run was (echoed into the report).
struct RunDescription {
  std::string label;
  std::string target;
  std::string model;
  int32_t vocab_size = 0;
  int32_t max_model_len = 0;
  int64_t concurrency = 0;   // max in flight, 0: unlimited
  double request_rate = 0;   // Poisson requests/s, 0: closed loop
  int64_t num_requests = 0;  // stop issuing after this many (0: no limit)
  double duration_s = 0;     // stop issuing after this long (0: no limit)
  std::string prompt_len;
  std::string output_len;
  int64_t num_prefixes = 0;
  int64_t prefix_len = 0;
  double cancel_fraction = 0;
  int64_t block_size = 16;
  int64_t warmup_requests = 0;
  bool ignore_eos = true;
  float temperature = 0;
};

// The server-side split of time to first token, from the finals' timings. For a remote
// prefill: queue (decode worker: arrival to reservation), prefill (prefill worker: arrival to
// last layer), KV transfer (the decode worker's wait for the KV beyond that: the reservation's
// way to the prefill worker and the transfer's tail) and first decode (the rest of the
// server's TTFT: verified KV to first token). For a local prefill: queue, prefill, and first decode
// (the rest).
struct TtftSplit {
  int64_t requests = 0;  // finals with timings
  int64_t remote = 0;    // of which prefilled on a prefill worker
  Summary queue;
  Summary prefill;
  Summary kv_transfer;
  Summary first_decode;
  Summary server_ttft;
  Summary client_overhead;  // client TTFT minus server TTFT (network, router, client)
};

// Reserved-but-unused KV slots over reserved slots. Three estimates:
//  * steps: the client's model summed over every decode step of each finished request;
//  * sampled: the client's model of the in-flight requests, sampled during the run;
//  * server: WorkerStats.kv_reserved_token_slots / kv_filled_token_slots sampled during the run
//    (only when the server reports them).
// Each for the paged pool (whole blocks up to the computed tokens), a static reservation
// (prompt + max_tokens from the start) and a reserve-max-length baseline (max_model_len).
struct KvWaste {
  double steps_paged = 0;
  double steps_static = 0;
  double steps_max_len = 0;
  int64_t samples = 0;
  double sampled_paged = 0;
  double sampled_static = 0;
  double sampled_max_len = 0;
  double mean_sequences = 0;  // in-flight sequences with a token, per sample
  int64_t server_samples = 0;
  double mean_running = 0;
  int64_t max_running = 0;
  double mean_waiting = 0;
  // The same over the samples taken while requests were being issued (LoadWindow): the closed
  // loop at full concurrency, without the final drain (when fewer and fewer remain in flight)
  // that the means over the whole run include. 0 samples: no window (or no server samples).
  int64_t server_samples_while_issuing = 0;
  double mean_running_while_issuing = 0;
  double mean_waiting_while_issuing = 0;
  // Tokens generated per engine step between the first and the last server sample while
  // issuing (WorkerStats counters): the decode batch steps really ran at, each step counted
  // once however long it took (time-sampled `running` weights long prefill steps more).
  // -1: fewer than two such samples or no step in between.
  double tokens_per_step_while_issuing = -1;
  double mean_blocks_used = 0;
  int64_t max_blocks_used = 0;
  int64_t blocks_total = 0;
  // 1 - (client model's filled slots) / (server's kv_blocks_used x block size), over the
  // samples: the server's actual reservations against the tokens the client has seen (counts
  // sequences still in prefill as reserved-but-empty, so it overstates the waste a little).
  double server_blocks_waste = -1;
  int64_t server_slot_samples = 0;
  double server_waste = -1;  // -1: not reported by the server
  double mean_reserved_slots = 0;
  double mean_filled_slots = 0;
  std::string server_note;
};

struct BenchReport {
  RunDescription run;
  int64_t issued = 0;
  int64_t completed = 0;
  int64_t cancelled = 0;
  int64_t cut = 0;  // still running when the run ended with cut_at_end
  int64_t failed = 0;
  std::map<std::string, int64_t> errors;  // message -> count
  double duration_s = 0;                  // first request sent to last stream ended
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cached_tokens = 0;
  double request_throughput = 0;  // completed requests/s
  double output_throughput = 0;   // output tokens/s
  double total_throughput = 0;    // (prompt + output) tokens/s
  LoadWindow window;
  double window_output_throughput = 0;  // output tokens/s while requests were being issued
  Summary ttft;
  Summary itl;
  Summary tpot;  // per request: (e2e - ttft) / (output tokens - 1)
  Summary e2e;
  Summary output_len;
  TtftSplit split;
  KvWaste kv;
};

BenchReport BuildReport(const RunDescription& run, const std::vector<CallResult>& results,
                        const std::vector<OccupancySample>& samples, const std::string& server_note,
                        const LoadWindow& window = {});

// A human-readable table.
void PrintReport(const BenchReport& report, std::FILE* out);
// The report as pretty-printed JSON (seconds as given; latencies in milliseconds under *_ms).
std::string ReportToJson(const BenchReport& report);

}  // namespace tandem::bench
