#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "prometheus/registry.h"

namespace tandem {

class HttpTransport;

// TLS of a /metrics endpoint, from PEM files.
struct HttpTlsOptions {
  std::string cert;       // PEM certificate (chain); empty: plaintext HTTP
  std::string key;        // PEM private key of `cert`
  std::string client_ca;  // non-empty: clients must present a certificate it signed (mTLS)
};

// Serves a registry at http://host:port/metrics (Prometheus text format 0.0.4) on its own port,
// with the HTTP server the OpenAI API runs on (common/http/http_transport.h: its connection,
// header, body and time limits hold here too); with TLS options, at https:// only (and with a
// client CA, only to clients holding a certificate it signed). One event-loop thread and one
// thread that serializes the registry. Not prometheus-cpp's pull exposer: its civetweb threads
// are created with a fixed 100 KiB stack, which glibc refuses (EINVAL) once CUDA's libraries put
// more static TLS than that in the process.
class MetricsServer {
 public:
  // Port 0 picks a free port. Fails (UNAVAILABLE) when the address cannot be bound,
  // INVALID_ARGUMENT when the TLS files cannot be loaded or the host is not an address or name.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry,
      const HttpTlsOptions& tls = {});
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const;

 private:
  MetricsServer() = default;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<HttpTransport> http_;  // stopped (its threads joined) before registry_ goes
};

// Registers the process-level families every Tandem process exports:
//   tandem_build_info{version, component}  constant 1
//   tandem_process_start_time_seconds      Unix time the process started serving
void RegisterProcessInfo(prometheus::Registry* registry, std::string_view component);

}  // namespace tandem
