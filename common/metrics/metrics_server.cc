#include "common/metrics/metrics_server.h"

#include <exception>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "unknown"
#endif

namespace tandem {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  // IPv6 literals need brackets in civetweb's listening_ports syntax.
  const std::string bind = host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                                               : absl::StrCat(host, ":", port);
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(bind, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", bind, ": ", e.what()));
  }
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (ports.empty())
    return absl::UnavailableError(absl::StrCat("metrics: no port bound on ", bind));
  server->port_ = ports.front();
  server->registry_ = std::move(registry);
  server->exposer_->RegisterCollectable(server->registry_);
  return server;
}

MetricsServer::~MetricsServer() = default;

void RegisterProcessInfo(prometheus::Registry* registry, std::string_view component) {
  prometheus::BuildGauge()
      .Name("tandem_build_info")
      .Help("Constant 1, labelled with the build's version and the process's component.")
      .Register(*registry)
      .Add({{"version", TANDEM_VERSION}, {"component", std::string(component)}})
      .Set(1);
  prometheus::BuildGauge()
      .Name("tandem_process_start_time_seconds")
      .Help("Start time of the process since the Unix epoch, in seconds.")
      .Register(*registry)
      .Add({})
      .Set(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
}

}  // namespace tandem
