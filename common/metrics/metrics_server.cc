#include "common/metrics/metrics_server.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/http/http_transport.h"
#include "prometheus/gauge.h"
#include "prometheus/text_serializer.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "unknown"
#endif

namespace tandem {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry,
    const HttpTlsOptions& tls) {
  HttpTransportOptions o;
  o.name = "metrics";
  o.host = host;
  o.port = port;
  // A scrape is one small GET: one thread moves bytes, one serializes; few scrapers connect.
  o.io_threads = 1;
  o.handler_threads = 1;
  o.max_body_bytes = 4096;
  o.max_connections = 256;
  o.max_connections_per_client = 32;
  o.tls_cert = tls.cert;
  o.tls_key = tls.key;
  o.tls_client_ca = tls.client_ca;
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->registry_ = std::move(registry);
  prometheus::Registry* families = server->registry_.get();
  std::vector<HttpRoute> routes;
  routes.push_back(
      {"GET", "/metrics", [families](const HttpRequest&, std::shared_ptr<HttpResponder> responder) {
         responder->Send(200, "text/plain; version=0.0.4; charset=utf-8",
                         prometheus::TextSerializer().Serialize(families->Collect()));
       }});
  // The transport's refusals (404, 405, 413, 431, ...): its messages are fixed ASCII text.
  auto error_page = [](int status, const std::string& message) {
    return absl::StrCat("{\"error\": {\"code\": ", status, ", \"message\": \"", message, "\"}}");
  };
  auto http = HttpTransport::Start(o, std::move(routes), std::move(error_page));
  if (!http.ok()) return http.status();
  server->http_ = std::move(http).value();
  return server;
}

MetricsServer::~MetricsServer() {
  if (http_ != nullptr) http_->Stop();
}

int MetricsServer::port() const { return http_->port(); }

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
