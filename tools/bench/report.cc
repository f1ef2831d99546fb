#include "tools/bench/report.h"

#include <algorithm>
#include <limits>

#include "tools/bench/kv_occupancy.h"

namespace tandem::bench {
namespace {

// Fields of Timings read by name so that the report works with servers (and protos) that do
// not split a remote prefill out yet.
double DoubleField(const google::protobuf::Message& m, const char* name) {
  const auto* field = m.GetDescriptor()->FindFieldByName(name);
  if (field == nullptr || field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE) {
    return 0;
  }
  return m.GetReflection()->GetDouble(m, field);
}

bool BoolField(const google::protobuf::Message& m, const char* name) {
  const auto* field = m.GetDescriptor()->FindFieldByName(name);
  if (field == nullptr || field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_BOOL) {
    return false;
  }
  return m.GetReflection()->GetBool(m, field);
}

TtftSplit BuildSplit(const std::vector<CallResult>& results) {
  std::vector<double> queue, prefill, transfer, first_decode, server_ttft, overhead;
  TtftSplit split;
  for (const CallResult& r : results) {
    if (!r.ok || !r.has_final || !r.final.has_timings()) continue;
    const v1::Timings& t = r.final.timings();
    if (t.time_to_first_token_s() <= 0) continue;
    ++split.requests;
    const bool remote = BoolField(t, "remote");
    const double pre = remote ? DoubleField(t, "remote_prefill_s") : t.prefill_s();
    const double xfer = remote ? DoubleField(t, "kv_transfer_s") : 0;
    split.remote += remote;
    queue.push_back(t.queue_s());
    prefill.push_back(pre);
    transfer.push_back(xfer);
    first_decode.push_back(std::max(0.0, t.time_to_first_token_s() - t.queue_s() - pre - xfer));
    server_ttft.push_back(t.time_to_first_token_s());
    if (r.ttft_s >= 0) overhead.push_back(r.ttft_s - t.time_to_first_token_s());
  }
  split.queue = Summarize(std::move(queue));
  split.prefill = Summarize(std::move(prefill));
  split.kv_transfer = Summarize(std::move(transfer));
  split.first_decode = Summarize(std::move(first_decode));
  split.server_ttft = Summarize(std::move(server_ttft));
  split.client_overhead = Summarize(std::move(overhead));
  return split;
}

KvWaste BuildKvWaste(const RunDescription& run, const std::vector<CallResult>& results,
                     const std::vector<OccupancySample>& samples, const LoadWindow& window) {
  KvWaste kv;
  KvSlots steps;
  for (const CallResult& r : results) {
    if (!r.ok) continue;
    steps += SlotsOverDecodeSteps(r.prompt_tokens, r.output_tokens, r.max_tokens, run.block_size,
                                  run.max_model_len);
  }
  kv.steps_paged = WasteFraction(steps.paged, steps.filled);
  kv.steps_static = WasteFraction(steps.static_reservation, steps.filled);
  kv.steps_max_len = WasteFraction(steps.max_len, steps.filled);

  KvSlots sampled;
  int64_t sequences = 0, running = 0, waiting = 0, used = 0, reserved = 0, filled = 0;
  int64_t model_filled_with_server = 0;
  int64_t running_issuing = 0, waiting_issuing = 0;
  const OccupancySample* first_issuing = nullptr;
  const OccupancySample* last_issuing = nullptr;
  for (const OccupancySample& s : samples) {
    ++kv.samples;
    sampled += s.model;
    sequences += s.model_sequences;
    if (!s.has_server) continue;
    ++kv.server_samples;
    running += s.running;
    waiting += s.waiting;
    if (window.seconds > 0 && s.t_s <= window.seconds) {
      ++kv.server_samples_while_issuing;
      if (first_issuing == nullptr) first_issuing = &s;
      last_issuing = &s;
      running_issuing += s.running;
      waiting_issuing += s.waiting;
    }
    used += s.kv_blocks_used;
    model_filled_with_server += s.model.filled;
    kv.max_running = std::max(kv.max_running, s.running);
    kv.max_blocks_used = std::max(kv.max_blocks_used, s.kv_blocks_used);
    kv.blocks_total = std::max(kv.blocks_total, s.kv_blocks_total);
    if (s.reserved_slots >= 0) {
      ++kv.server_slot_samples;
      reserved += s.reserved_slots;
      filled += s.filled_slots;
    }
  }
  kv.sampled_paged = WasteFraction(sampled.paged, sampled.filled);
  kv.sampled_static = WasteFraction(sampled.static_reservation, sampled.filled);
  kv.sampled_max_len = WasteFraction(sampled.max_len, sampled.filled);
  if (kv.samples > 0) kv.mean_sequences = static_cast<double>(sequences) / kv.samples;
  if (kv.server_samples > 0) {
    const double n = static_cast<double>(kv.server_samples);
    kv.mean_running = running / n;
    kv.mean_waiting = waiting / n;
    kv.mean_blocks_used = used / n;
    if (used > 0)
      kv.server_blocks_waste = WasteFraction(used * run.block_size, model_filled_with_server);
  }
  if (kv.server_samples_while_issuing > 0) {
    const double n = static_cast<double>(kv.server_samples_while_issuing);
    kv.mean_running_while_issuing = running_issuing / n;
    kv.mean_waiting_while_issuing = waiting_issuing / n;
    const int64_t steps = last_issuing->steps - first_issuing->steps;
    if (steps > 0) {
      kv.tokens_per_step_while_issuing =
          static_cast<double>(last_issuing->generated_tokens - first_issuing->generated_tokens) /
          static_cast<double>(steps);
    }
  }
  if (kv.server_slot_samples > 0) {
    kv.server_waste = WasteFraction(reserved, filled);
    kv.mean_reserved_slots = static_cast<double>(reserved) / kv.server_slot_samples;
    kv.mean_filled_slots = static_cast<double>(filled) / kv.server_slot_samples;
  }
  return kv;
}

}  // namespace

BenchReport BuildReport(const RunDescription& run, const std::vector<CallResult>& results,
                        const std::vector<OccupancySample>& samples, const std::string& server_note,
                        const LoadWindow& window) {
  BenchReport report;
  report.run = run;
  report.issued = static_cast<int64_t>(results.size());
  double first = std::numeric_limits<double>::infinity(), last = 0;
  std::vector<double> ttft, itl, tpot, e2e, output_len;
  for (const CallResult& r : results) {
    first = std::min(first, r.start_s);
    last = std::max(last, r.start_s + r.e2e_s);
    report.output_tokens += r.output_tokens;
    if (r.ok) {
      ++report.completed;
    } else if (r.cancelled) {
      ++report.cancelled;
    } else if (r.cut) {
      ++report.cut;
    } else {
      ++report.failed;
      ++report.errors[r.error];
    }
    if (r.ok || r.cancelled || r.cut) report.prompt_tokens += r.prompt_tokens;
    if (r.has_final) report.cached_tokens += r.final.usage().cached_tokens();
    if (r.ttft_s >= 0) ttft.push_back(r.ttft_s);
    itl.insert(itl.end(), r.itl_s.begin(), r.itl_s.end());
    if (!r.ok) continue;
    e2e.push_back(r.e2e_s);
    output_len.push_back(r.output_tokens);
    if (r.output_tokens > 1 && r.ttft_s >= 0) {
      tpot.push_back((r.e2e_s - r.ttft_s) / (r.output_tokens - 1));
    }
  }
  report.duration_s = results.empty() ? 0 : last - first;
  if (report.duration_s > 0) {
    report.request_throughput = report.completed / report.duration_s;
    report.output_throughput = report.output_tokens / report.duration_s;
    report.total_throughput = (report.prompt_tokens + report.output_tokens) / report.duration_s;
  }
  report.window = window;
  if (window.seconds > 0) report.window_output_throughput = window.output_tokens / window.seconds;
  report.ttft = Summarize(std::move(ttft));
  report.itl = Summarize(std::move(itl));
  report.tpot = Summarize(std::move(tpot));
  report.e2e = Summarize(std::move(e2e));
  report.output_len = Summarize(std::move(output_len));
  report.split = BuildSplit(results);
  report.kv = BuildKvWaste(run, results, samples, window);
  report.kv.server_note = server_note;
  return report;
}

}  // namespace tandem::bench
