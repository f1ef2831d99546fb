#include "common/metrics/http_metrics.h"

#include <string>

namespace tandem {

using prometheus::BuildCounter;
using prometheus::BuildGauge;

HttpMetrics::HttpMetrics(prometheus::Registry* registry) {
  open_ = &BuildGauge()
               .Name("tandem_http_connections_open")
               .Help("HTTP API connections open now.")
               .Register(*registry)
               .Add({});
  accepted_ = &BuildCounter()
                   .Name("tandem_http_connections_total")
                   .Help("HTTP API connections accepted.")
                   .Register(*registry)
                   .Add({});
  rejected_ = &BuildCounter()
                   .Name("tandem_http_rejected_total")
                   .Help(
                       "HTTP API connections or requests turned away by a limit, by reason "
                       "(max_connections, per_client, header_too_large, too_many_headers, "
                       "body_too_large, malformed, accept_failed).")
                   .Register(*registry);
  for (const char* r : {"max_connections", "per_client", "header_too_large", "too_many_headers",
                        "body_too_large", "malformed", "accept_failed"}) {
    rejected_->Add({{"reason", r}});
  }
  timeouts_ = &BuildCounter()
                   .Name("tandem_http_timeouts_total")
                   .Help(
                       "HTTP API connections closed for a time or space limit, by kind (header, "
                       "body, idle, write, buffer_overflow).")
                   .Register(*registry);
  for (const char* k : {"header", "body", "idle", "write", "buffer_overflow"}) {
    timeouts_->Add({{"kind", k}});
  }
}

void HttpMetrics::ConnectionOpened() {
  open_->Increment();
  accepted_->Increment();
}

void HttpMetrics::ConnectionClosed() { open_->Decrement(); }

void HttpMetrics::Rejected(std::string_view reason) {
  rejected_->Add({{"reason", std::string(reason)}}).Increment();
}

void HttpMetrics::TimedOut(std::string_view kind) {
  timeouts_->Add({{"kind", std::string(kind)}}).Increment();
}

}  // namespace tandem
