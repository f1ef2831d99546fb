// `tandem bench`: a load generator for a Tandem server (the Generation gRPC API). Prompts are
// random token ids within the served vocabulary, so no tokenizer is needed.

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_split.h"
#include "common/base/flags.h"
#include "tools/bench/bench_runner.h"
#include "tools/commands.h"

namespace tandem {

int RunBench(int argc, char** argv) {
  bench::BenchOptions o;
  std::string prompt_len = "uniform:32:256", output_len = "uniform:16:128";
  std::string stats_targets, json_out;
  int64_t seed = 1;
  bool quiet = false, allow_errors = false;
  FlagSet flags("bench",
                "Drives a Tandem server with Generate streams at a fixed concurrency or a Poisson\n"
                "request rate and reports throughput, TTFT, inter-token and end-to-end latency\n"
                "(table on stdout, JSON with --json-out). Lengths: N, fixed:N, uniform:MIN:MAX,\n"
                "lognormal:MEAN:SIGMA[:MAX].");
  flags.String("target", &o.target, "server address host:port");
  flags.String("model", &o.model, "served model name (default: the server's first)");
  flags.Int("concurrency", &o.concurrency,
            "requests in flight (closed loop); with --request-rate the cap (0: none)");
  flags.Double("request-rate", &o.request_rate, "Poisson arrivals in requests/s (0: closed loop)");
  flags.Int("num-requests", &o.num_requests,
            "requests to measure (default 100 without --duration)");
  flags.Double("duration", &o.duration_s, "seconds to issue requests for (in-flight ones finish)");
  flags.Bool("cut-at-end", &o.cut_at_end,
             "with --duration: cancel the requests still in flight when it ends");
  flags.Int("warmup-requests", &o.warmup_requests, "unmeasured requests run first");
  flags.String("prompt-len", &prompt_len,
               "prompt length distribution (the unique suffix with "
               "--shared-prefixes)");
  flags.String("output-len", &output_len, "output length distribution (max_tokens)");
  flags.Int("shared-prefixes", &o.workload.num_prefixes,
            "distinct shared prefixes; each request is one of them + a unique suffix");
  flags.Int("prefix-len", &o.workload.prefix_len, "tokens of each shared prefix");
  flags.Double("cancel-fraction", &o.workload.cancel_fraction,
               "fraction of requests cancelled after a random number of tokens");
  flags.Bool("ignore-eos", &o.ignore_eos, "generate max_tokens whatever the model samples");
  flags.Float("temperature", &o.temperature, "sampling temperature (0: greedy)");
  flags.Int("seed", &seed, "workload seed (same seed, same requests)");
  flags.Int("block-size", &o.block_size, "the server's KV block size (KV waste model)");
  flags.Double("sample-interval", &o.sample_interval_s,
               "seconds between occupancy samples (0: off)");
  flags.String("stats-targets", &stats_targets,
               "comma-separated worker addresses for Worker.GetStats (default: --target; a "
               "server without the Worker API reports through RouterAdmin)");
  flags.Double("connect-timeout", &o.connect_timeout_s, "seconds to wait for the server");
  flags.Double("request-timeout", &o.request_timeout_s, "deadline of each request in seconds");
  flags.Double("progress-interval", &o.progress_interval_s,
               "seconds between progress lines on stderr (0: off)");
  flags.String("json-out", &json_out, "write the report as JSON to this file");
  flags.String("label", &o.label, "a name for this run, echoed in the report");
  flags.Bool("quiet", &quiet, "no table on stdout");
  flags.Bool("allow-errors", &allow_errors, "exit 0 even when requests failed");
  if (auto exit_code = flags.ParseCommandLine(argc, argv)) return *exit_code;
  auto prompt = bench::ParseLengthDistribution(prompt_len);
  auto output = bench::ParseLengthDistribution(output_len);
  for (const auto* d : {&prompt, &output}) {
    if (!d->ok()) {
      std::fprintf(stderr, "bench: %s\n", std::string(d->status().message()).c_str());
      return 2;
    }
  }
  o.workload.prompt_len = *prompt;
  o.workload.output_len = *output;
  o.workload.seed = static_cast<uint64_t>(seed);
  if (o.num_requests <= 0 && o.duration_s <= 0) o.num_requests = 100;
  if (o.workload.num_prefixes > 0 && o.workload.prefix_len < 1) {
    std::fprintf(stderr, "bench: --shared-prefixes needs --prefix-len >= 1\n");
    return 2;
  }
  if (o.workload.cancel_fraction < 0 || o.workload.cancel_fraction > 1) {
    std::fprintf(stderr, "bench: --cancel-fraction must be in [0, 1]\n");
    return 2;
  }
  if (!stats_targets.empty()) o.stats_targets = absl::StrSplit(stats_targets, ',');

  auto report = bench::RunBench(o);
  if (!report.ok()) {
    std::fprintf(stderr, "bench: %s\n", std::string(report.status().message()).c_str());
    return 1;
  }
  if (!quiet) bench::PrintReport(*report, stdout);
  if (!json_out.empty()) {
    std::ofstream out(json_out);
    out << bench::ReportToJson(*report);
    if (!out) {
      std::fprintf(stderr, "bench: cannot write %s\n", json_out.c_str());
      return 1;
    }
  }
  if (report->failed > 0 && !allow_errors) {
    std::fprintf(stderr, "bench: %lld of %lld requests failed\n",
                 static_cast<long long>(report->failed), static_cast<long long>(report->issued));
    return 1;
  }
  return 0;
}

}  // namespace tandem
