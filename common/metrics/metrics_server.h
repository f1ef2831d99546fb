#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/statusor.h"
#include "common/http/http_server_factory.h"
#include "prometheus/registry.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace tandem {

// Serves a registry at http://host:port/metrics (Prometheus text format 0.0.4) on its own port
// and thread (cpp-httplib); with TLS options, at https:// only (and with a client CA, only to
// clients holding a certificate it signed). Not prometheus-cpp's pull exposer: its civetweb threads
// are created with a fixed 100 KiB stack, which glibc refuses (EINVAL) once CUDA's libraries put
// more static TLS than that in the process.
class MetricsServer {
 public:
  // Port 0 picks a free port. Fails (UNAVAILABLE) when the address cannot be bound,
  // INVALID_ARGUMENT when the TLS files cannot be loaded.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry,
      const HttpTlsOptions& tls = {});
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  std::shared_ptr<prometheus::Registry> registry_;
  int port_ = 0;
};

// Registers the process-level families every Tandem process exports:
//   tandem_build_info{version, component}  constant 1
//   tandem_process_start_time_seconds      Unix time the process started serving
void RegisterProcessInfo(prometheus::Registry* registry, std::string_view component);

}  // namespace tandem
