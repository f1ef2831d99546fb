#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/base/flags.h"
#include "common/metrics/metrics_server.h"
#include "prometheus/registry.h"

namespace tandem {

// Where a process serves /metrics. Filled from the command line by RegisterMetricsFlags.
struct MetricsOptions {
  std::string host;       // empty: the process's gRPC --host
  int64_t port = 0;       // 0: no endpoint (metrics are still collected); -1: any free port
  std::string port_file;  // write the bound port here once serving
  // HTTPS only when tls.cert is set; mTLS with tls.client_ca. Not flags of their own: the
  // commands fill it from their --tls-* flags (ServerOptions::Metrics, common/rpc/server.h), so
  // /metrics is as protected as the process's other listeners.
  HttpTlsOptions tls;
};

// Registers --metrics-host, --metrics-port and --metrics-port-file (for server commands' main).
void RegisterMetricsFlags(FlagSet* flags, MetricsOptions* options);

// One process's metrics: a registry holding tandem_build_info and the start time, into which
// the process's components declare their families, and the /metrics endpoint when enabled.
class ProcessMetrics {
 public:
  // `component` labels tandem_build_info (serve, router, prefill, decode, worker). Logs the
  // bound port when serving.
  static absl::StatusOr<std::unique_ptr<ProcessMetrics>> Start(const MetricsOptions& options,
                                                               std::string_view component,
                                                               const std::string& default_host);

  prometheus::Registry* registry() { return registry_.get(); }
  // The bound /metrics port, 0 when not serving.
  int port() const { return server_ != nullptr ? server_->port() : 0; }

 private:
  ProcessMetrics() = default;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<MetricsServer> server_;
};

}  // namespace tandem
