#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "prometheus/registry.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace tandem {

// Serves a registry at http://host:port/metrics (Prometheus text format) on its own port, via
// prometheus-cpp's pull exposer (civetweb, 2 threads). Besides the registry's families the
// exposer adds its own `exposer_*` families (scrapes, bytes, scrape latency).
class MetricsServer {
 public:
  // Port 0 picks a free port. Fails (UNAVAILABLE) when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  int port_ = 0;
};

// Registers the process-level families every Tandem process exports:
//   tandem_build_info{version, component}  constant 1
//   tandem_process_start_time_seconds      Unix time the process started serving
void RegisterProcessInfo(prometheus::Registry* registry, std::string_view component);

}  // namespace tandem
