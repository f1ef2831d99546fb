#include "common/metrics/metrics_server.h"

#include <sys/socket.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "httplib.h"
#include "prometheus/gauge.h"
#include "prometheus/text_serializer.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "unknown"
#endif

namespace tandem {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& host, int port, std::shared_ptr<prometheus::Registry> registry,
    const HttpTlsOptions& tls) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->registry_ = std::move(registry);
  auto http_server = NewHttpServer(tls, "metrics");
  if (!http_server.ok()) return http_server.status();
  server->http_ = std::move(http_server).value();
  httplib::Server& http = *server->http_;
  http.new_task_queue = [] { return new httplib::ThreadPool(/*n=*/2); };
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would let a second
  // process bind the same port and take half the scrapes.
  http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  http.set_read_timeout(10, 0);
  http.set_write_timeout(10, 0);
  prometheus::Registry* families = server->registry_.get();
  http.Get("/metrics", [families](const httplib::Request&, httplib::Response& response) {
    const std::string text = prometheus::TextSerializer().Serialize(families->Collect());
    response.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
  });
  const std::string where = absl::StrCat(host, " port ", port);
  server->port_ =
      port == 0 ? http.bind_to_any_port(host) : (http.bind_to_port(host, port) ? port : -1);
  if (server->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("metrics: cannot listen on ", where));
  }
  server->thread_ = std::thread([&http] { http.listen_after_bind(); });
  // stop() is a no-op until the loop runs: wait for it so the destructor can always stop it.
  while (!http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return server;
}

MetricsServer::~MetricsServer() {
  if (http_ != nullptr) http_->stop();
  if (thread_.joinable()) thread_.join();
}

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
