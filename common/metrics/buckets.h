#pragma once

#include <vector>

namespace tandem {

// Histogram bucket boundaries shared by every component, so that dashboards and recording rules
// can aggregate the same metric across processes. Units are Prometheus base units (seconds,
// bytes, tokens).
namespace buckets {

// Time to first token and queue time: 1 ms .. 80 s.
const std::vector<double>& FirstTokenSeconds();
// Inter-token latency and engine step time: 0.5 ms .. 2.5 s.
const std::vector<double>& InterTokenSeconds();
// End-to-end request latency and prefill time: 10 ms .. 480 s.
const std::vector<double>& RequestSeconds();
// KV transfer duration: 0.5 ms .. 10 s.
const std::vector<double>& TransferSeconds();
// KV transfer size: 4 KiB .. 4 GiB in powers of 4.
const std::vector<double>& TransferBytes();
// Token counts per request (prompt or completion): 1 .. 32768 in powers of 2.
const std::vector<double>& RequestTokens();
// Tokens accepted per speculative verification: 0 .. 16.
const std::vector<double>& AcceptedTokens();

}  // namespace buckets
}  // namespace tandem
