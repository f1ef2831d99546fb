#pragma once

#include <string_view>

#include "common/http/http_hooks.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace tandem {

// Metric families of the HTTP API's transport. Thread-safe.
//
//   tandem_http_connections_open
//   tandem_http_connections_total
//   tandem_http_rejected_total{reason}
//   tandem_http_timeouts_total{kind}
class HttpMetrics : public HttpHooks {
 public:
  explicit HttpMetrics(prometheus::Registry* registry);
  HttpMetrics(const HttpMetrics&) = delete;
  HttpMetrics& operator=(const HttpMetrics&) = delete;

  void ConnectionOpened() override;
  void ConnectionClosed() override;
  void Rejected(std::string_view reason) override;
  void TimedOut(std::string_view kind) override;

 private:
  prometheus::Gauge* open_;
  prometheus::Counter* accepted_;
  prometheus::Family<prometheus::Counter>* rejected_;
  prometheus::Family<prometheus::Counter>* timeouts_;
};

}  // namespace tandem
