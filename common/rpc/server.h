#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/flags.h"
#include "common/metrics/process_metrics.h"
#include "common/rpc/call_auth.h"
#include "common/rpc/tls.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace tandem {

// The listeners of a serving process (router, worker, serve): the gRPC address, the drain on
// SIGTERM, log format, /metrics and TLS. Each command sets its default `port` before
// RegisterFlags; every other default is the one written here.
struct ServerOptions {
  std::string host = "127.0.0.1";
  int64_t port = 0;       // 0: any free port
  std::string port_file;  // the bound port is written here (atomically) once serving
  double drain_timeout_s = 60;
  bool log_json = false;
  MetricsOptions metrics;  // --metrics-host, --metrics-port, --metrics-port-file
  TlsOptions tls;          // on every listener of the process (gRPC, HTTP, /metrics)

  // --host, --port, --port-file, --drain-timeout, --log-json, the metrics flags, --tls-*.
  void RegisterFlags(FlagSet* flags);
  // `metrics` with the TLS of the other listeners: /metrics over HTTPS when tls.cert is set,
  // requiring a client certificate signed by tls.ca when tls.client_auth.
  MetricsOptions Metrics() const;
};

// Configures logging (text or JSON, tagged `component`) and starts the process's metrics
// registry (and /metrics endpoint when enabled).
absl::StatusOr<std::unique_ptr<ProcessMetrics>> StartServerProcess(const ServerOptions& options,
                                                                   std::string_view component);

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};
// Starts a gRPC server on host:port with the TLS credentials, gRPC's health service (SERVING
// until a drain) and reflection, and writes the bound port to port_file when set. Every call
// passes `policy` (call_auth.h) before it reaches a handler.
absl::StatusOr<RunningServer> StartGrpcServer(const ServerOptions& options,
                                              const std::vector<grpc::Service*>& services,
                                              std::shared_ptr<const CallPolicy> policy);

// Writes `content` to a temporary file and renames it onto `path`, so readers never see a part.
void WriteFileAtomically(const std::string& path, const std::string& content);

}  // namespace tandem
