// Formatting of a BenchReport: a table for people, JSON for scripts.

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "tools/bench/report.h"

namespace tandem::bench {
namespace {

using Json = nlohmann::ordered_json;

std::string LoadText(const RunDescription& run) {
  if (run.request_rate > 0) {
    return absl::StrFormat(
        "Poisson %.3g req/s, %s in flight", run.request_rate,
        run.concurrency > 0 ? absl::StrCat("at most ", run.concurrency) : std::string("unlimited"));
  }
  return absl::StrCat("closed loop, concurrency ", run.concurrency);
}

std::string WorkloadText(const RunDescription& run) {
  std::string s = absl::StrCat("prompt ", run.prompt_len, ", output ", run.output_len);
  if (run.num_prefixes > 0) {
    absl::StrAppend(&s, ", ", run.num_prefixes, " shared prefixes of ", run.prefix_len,
                    " tokens (prompt length is the unique suffix)");
  }
  if (run.cancel_fraction > 0) {
    absl::StrAppend(&s, absl::StrFormat(", cancel %.0f%%", run.cancel_fraction * 100));
  }
  absl::StrAppend(&s, run.ignore_eos ? ", ignore_eos" : ", stops at EOS",
                  run.temperature == 0 ? ", greedy" : absl::StrFormat(", T=%g", run.temperature));
  return s;
}

void PrintLatency(std::FILE* out, const char* name, const Summary& s) {
  std::fprintf(out, "  %-16s %9.2f %9.2f %9.2f %9.2f %9.2f %8lld\n", name, s.mean * 1e3,
               s.p50 * 1e3, s.p90 * 1e3, s.p99 * 1e3, s.max * 1e3, static_cast<long long>(s.count));
}

std::string Percent(double f) { return f < 0 ? "n/a" : absl::StrFormat("%.1f%%", f * 100); }

Json SummaryJson(const Summary& s, double scale) {
  return Json{{"count", s.count},     {"mean", s.mean * scale}, {"min", s.min * scale},
              {"p50", s.p50 * scale}, {"p90", s.p90 * scale},   {"p99", s.p99 * scale},
              {"max", s.max * scale}};
}

}  // namespace

void PrintReport(const BenchReport& r, std::FILE* out) {
  const RunDescription& run = r.run;
  std::fprintf(out, "==== tandem bench%s%s ====\n", run.label.empty() ? "" : ": ",
               run.label.c_str());
  std::fprintf(out, "%-12s %s (model %s, vocab %d, context %d)\n", "Target", run.target.c_str(),
               run.model.c_str(), run.vocab_size, run.max_model_len);
  std::fprintf(out, "%-12s %s\n", "Load", LoadText(run).c_str());
  std::fprintf(out, "%-12s %s\n", "Workload", WorkloadText(run).c_str());
  std::fprintf(
      out, "%-12s %lld issued, %lld completed, %lld cancelled, %lld cut at the end, %lld failed\n",
      "Requests", static_cast<long long>(r.issued), static_cast<long long>(r.completed),
      static_cast<long long>(r.cancelled), static_cast<long long>(r.cut),
      static_cast<long long>(r.failed));
  for (const auto& [message, count] : r.errors) {
    std::fprintf(out, "%-12s %lld x %s\n", "  error", static_cast<long long>(count),
                 message.c_str());
  }
  std::fprintf(out, "%-12s %.2f s\n", "Duration", r.duration_s);
  std::fprintf(out, "%-12s %.3f req/s, %.1f output tok/s, %.1f total tok/s\n", "Throughput",
               r.request_throughput, r.output_throughput, r.total_throughput);
  if (r.window.seconds > 0) {
    std::fprintf(out, "%-12s %.1f output tok/s while issuing requests (first %.1f s)\n", "",
                 r.window_output_throughput, r.window.seconds);
  }
  std::fprintf(out, "%-12s prompt %lld, output %lld, prefix-cached %lld\n", "Tokens",
               static_cast<long long>(r.prompt_tokens), static_cast<long long>(r.output_tokens),
               static_cast<long long>(r.cached_tokens));
  std::fprintf(out, "\n  %-16s %9s %9s %9s %9s %9s %8s\n", "latency (ms)", "mean", "p50", "p90",
               "p99", "max", "n");
  PrintLatency(out, "TTFT", r.ttft);
  PrintLatency(out, "inter-token", r.itl);
  PrintLatency(out, "TPOT", r.tpot);
  PrintLatency(out, "end-to-end", r.e2e);
  if (r.split.requests > 0) {
    std::fprintf(out, "\n  server TTFT split (%lld finals, %lld remote prefills)\n",
                 static_cast<long long>(r.split.requests), static_cast<long long>(r.split.remote));
    PrintLatency(out, "queue", r.split.queue);
    PrintLatency(out, "prefill", r.split.prefill);
    PrintLatency(out, "kv transfer", r.split.kv_transfer);
    PrintLatency(out, "first decode", r.split.first_decode);
    PrintLatency(out, "server TTFT", r.split.server_ttft);
    PrintLatency(out, "client overhead", r.split.client_overhead);
  }
  const KvWaste& kv = r.kv;
  std::fprintf(out, "\n  KV waste (reserved-unused / reserved)    paged   static  max-len\n");
  std::fprintf(out, "  per decode step (client model)      %8s %8s %8s\n",
               Percent(kv.steps_paged).c_str(), Percent(kv.steps_static).c_str(),
               Percent(kv.steps_max_len).c_str());
  if (kv.samples > 0) {
    std::fprintf(out, "  sampled in flight (client model)    %8s %8s %8s  (%lld samples)\n",
                 Percent(kv.sampled_paged).c_str(), Percent(kv.sampled_static).c_str(),
                 Percent(kv.sampled_max_len).c_str(), static_cast<long long>(kv.samples));
  }
  if (kv.server_blocks_waste >= 0) {
    std::fprintf(out, "  server blocks used vs client tokens %8s   (this server's policy)\n",
                 Percent(kv.server_blocks_waste).c_str());
  }
  if (kv.server_slot_samples > 0) {
    std::fprintf(out, "  server kv_*_token_slots             %8s   (this server's policy)\n",
                 Percent(kv.server_waste).c_str());
  }
  if (kv.server_samples > 0) {
    std::fprintf(out,
                 "  server: running %.1f mean (max %lld), waiting %.1f, KV blocks used %.0f mean "
                 "(max %lld) of %lld\n",
                 kv.mean_running, static_cast<long long>(kv.max_running), kv.mean_waiting,
                 kv.mean_blocks_used, static_cast<long long>(kv.max_blocks_used),
                 static_cast<long long>(kv.blocks_total));
    if (kv.server_samples_while_issuing > 0) {
      std::fprintf(out,
                   "  server while issuing: running %.1f mean, waiting %.1f, %.2f tokens per step "
                   "(%lld samples)\n",
                   kv.mean_running_while_issuing, kv.mean_waiting_while_issuing,
                   kv.tokens_per_step_while_issuing,
                   static_cast<long long>(kv.server_samples_while_issuing));
    }
  }
  if (!kv.server_note.empty()) std::fprintf(out, "  note: %s\n", kv.server_note.c_str());
  std::fflush(out);
}

std::string ReportToJson(const BenchReport& r) {
  const RunDescription& run = r.run;
  Json j;
  j["label"] = run.label;
  j["config"] = Json{{"target", run.target},
                     {"model", run.model},
                     {"vocab_size", run.vocab_size},
                     {"max_model_len", run.max_model_len},
                     {"concurrency", run.concurrency},
                     {"request_rate", run.request_rate},
                     {"num_requests", run.num_requests},
                     {"duration_s", run.duration_s},
                     {"prompt_len", run.prompt_len},
                     {"output_len", run.output_len},
                     {"num_prefixes", run.num_prefixes},
                     {"prefix_len", run.prefix_len},
                     {"cancel_fraction", run.cancel_fraction},
                     {"block_size", run.block_size},
                     {"warmup_requests", run.warmup_requests},
                     {"ignore_eos", run.ignore_eos},
                     {"temperature", run.temperature}};
  j["requests"] = Json{{"issued", r.issued},
                       {"completed", r.completed},
                       {"cancelled", r.cancelled},
                       {"cut", r.cut},
                       {"failed", r.failed}};
  Json errors = Json::object();
  for (const auto& [message, count] : r.errors) errors[message] = count;
  j["errors"] = errors;
  j["duration_s"] = r.duration_s;
  j["tokens"] =
      Json{{"prompt", r.prompt_tokens}, {"output", r.output_tokens}, {"cached", r.cached_tokens}};
  j["throughput"] = Json{{"requests_per_s", r.request_throughput},
                         {"output_tokens_per_s", r.output_throughput},
                         {"total_tokens_per_s", r.total_throughput},
                         {"issuing_s", r.window.seconds},
                         {"output_tokens_per_s_while_issuing", r.window_output_throughput}};
  j["ttft_ms"] = SummaryJson(r.ttft, 1e3);
  j["itl_ms"] = SummaryJson(r.itl, 1e3);
  j["tpot_ms"] = SummaryJson(r.tpot, 1e3);
  j["e2e_ms"] = SummaryJson(r.e2e, 1e3);
  j["output_len"] = SummaryJson(r.output_len, 1);
  j["server_ttft_split_ms"] = Json{{"requests", r.split.requests},
                                   {"remote", r.split.remote},
                                   {"queue", SummaryJson(r.split.queue, 1e3)},
                                   {"prefill", SummaryJson(r.split.prefill, 1e3)},
                                   {"kv_transfer", SummaryJson(r.split.kv_transfer, 1e3)},
                                   {"first_decode", SummaryJson(r.split.first_decode, 1e3)},
                                   {"server_ttft", SummaryJson(r.split.server_ttft, 1e3)},
                                   {"client_overhead", SummaryJson(r.split.client_overhead, 1e3)}};
  const KvWaste& kv = r.kv;
  j["kv_waste"] = Json{
      {"steps",
       Json{{"paged", kv.steps_paged}, {"static", kv.steps_static}, {"max_len", kv.steps_max_len}}},
      {"sampled", Json{{"samples", kv.samples},
                       {"paged", kv.sampled_paged},
                       {"static", kv.sampled_static},
                       {"max_len", kv.sampled_max_len},
                       {"mean_sequences", kv.mean_sequences}}},
      {"server",
       Json{{"samples", kv.server_samples},
            {"slot_samples", kv.server_slot_samples},
            {"waste", kv.server_slot_samples > 0 ? Json(kv.server_waste) : Json()},
            {"blocks_waste", kv.server_blocks_waste >= 0 ? Json(kv.server_blocks_waste) : Json()},
            {"mean_reserved_slots", kv.mean_reserved_slots},
            {"mean_filled_slots", kv.mean_filled_slots},
            {"mean_running", kv.mean_running},
            {"max_running", kv.max_running},
            {"mean_waiting", kv.mean_waiting},
            {"samples_while_issuing", kv.server_samples_while_issuing},
            {"mean_running_while_issuing", kv.mean_running_while_issuing},
            {"mean_waiting_while_issuing", kv.mean_waiting_while_issuing},
            {"tokens_per_step_while_issuing", kv.tokens_per_step_while_issuing >= 0
                                                  ? Json(kv.tokens_per_step_while_issuing)
                                                  : Json()},
            {"mean_blocks_used", kv.mean_blocks_used},
            {"max_blocks_used", kv.max_blocks_used},
            {"blocks_total", kv.blocks_total},
            {"note", kv.server_note}}}};
  return j.dump(2) + "\n";
}

}  // namespace tandem::bench
