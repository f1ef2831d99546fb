#include "common/rpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"

namespace tandem {

void ServerOptions::RegisterFlags(FlagSet* f) {
  f->String("host", &host, "address to listen on");
  f->Int("port", &port, "port to listen on (0: any free port)");
  f->String("port-file", &port_file, "write the bound port to this file once serving");
  f->Double("drain-timeout", &drain_timeout_s, "seconds to let requests finish on SIGTERM");
  f->Bool("log-json", &log_json, "log one JSON object per line");
  RegisterMetricsFlags(f, &metrics);
  f->String("tls-cert", &tls.cert, "PEM certificate (chain): TLS on the gRPC and HTTP listeners");
  f->String("tls-key", &tls.key, "PEM private key of --tls-cert");
  f->String("tls-ca", &tls.ca, "PEM CA certificates that peers' certificates must chain to");
  f->Bool("tls-client-auth", &tls.client_auth,
          "mTLS: refuse clients without a certificate signed by --tls-ca");
}

MetricsOptions ServerOptions::Metrics() const {
  MetricsOptions m = metrics;
  m.tls.cert = tls.cert;
  m.tls.key = tls.key;
  if (tls.client_auth) m.tls.client_ca = tls.ca;
  return m;
}

absl::StatusOr<std::unique_ptr<ProcessMetrics>> StartServerProcess(const ServerOptions& options,
                                                                   std::string_view component) {
  ConfigureLogging({LogLevel::kInfo, options.log_json, std::string(component)});
  return ProcessMetrics::Start(options.Metrics(), component, options.host);
}

void WriteFileAtomically(const std::string& path, const std::string& content) {
  std::ofstream(path + ".tmp") << content;
  std::error_code ec;
  std::filesystem::rename(path + ".tmp", path, ec);
}

absl::StatusOr<RunningServer> StartGrpcServer(const ServerOptions& options,
                                              const std::vector<grpc::Service*>& services,
                                              std::shared_ptr<const CallPolicy> policy) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  auto credentials = MakeServerCredentials(options.tls, std::move(policy));
  if (!credentials.ok()) return credentials.status();
  grpc::ServerBuilder builder;
  RunningServer running;
  builder.AddListeningPort(absl::StrCat(options.host, ":", options.port), *credentials,
                           &running.port);
  builder.SetMaxReceiveMessageSize(64 << 20);
  for (grpc::Service* s : services) builder.RegisterService(s);
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || running.port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.host, ":", options.port));
  }
  running.server->GetHealthCheckService()->SetServingStatus(true);
  if (!options.port_file.empty()) {
    WriteFileAtomically(options.port_file, absl::StrCat(running.port, "\n"));
  }
  return running;
}

}  // namespace tandem
