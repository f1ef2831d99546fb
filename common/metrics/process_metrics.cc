#include "common/metrics/process_metrics.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"

namespace tandem {

void RegisterMetricsFlags(FlagSet* flags, MetricsOptions* options) {
  flags->String("metrics-host", &options->host,
                "address of the Prometheus /metrics endpoint (default: --host)");
  flags->Int("metrics-port", &options->port,
             "port of the Prometheus /metrics endpoint (0: off; -1: any free port)");
  flags->String("metrics-port-file", &options->port_file,
                "write the bound /metrics port to this file once serving");
}

absl::StatusOr<std::unique_ptr<ProcessMetrics>> ProcessMetrics::Start(
    const MetricsOptions& options, std::string_view component, const std::string& default_host) {
  if (options.port < -1 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-port must be -1, 0 or a port number, got ", options.port));
  }
  std::unique_ptr<ProcessMetrics> m(new ProcessMetrics());
  m->registry_ = std::make_shared<prometheus::Registry>();
  RegisterProcessInfo(m->registry_.get(), component);
  if (options.port == 0) return m;
  const std::string host = options.host.empty() ? default_host : options.host;
  auto server = MetricsServer::Start(host, options.port < 0 ? 0 : static_cast<int>(options.port),
                                     m->registry_, options.tls);
  if (!server.ok()) return server.status();
  m->server_ = std::move(server).value();
  if (!options.port_file.empty()) {
    const std::string tmp = options.port_file + ".tmp";
    std::ofstream(tmp) << m->server_->port() << "\n";
    std::error_code ec;
    std::filesystem::rename(tmp, options.port_file, ec);
    if (ec) {
      return absl::InternalError(
          absl::StrCat("cannot write ", options.port_file, ": ", ec.message()));
    }
  }
  TLOG(INFO) << "metrics on port " << m->server_->port();
  return m;
}

}  // namespace tandem
