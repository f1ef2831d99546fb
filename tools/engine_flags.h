#pragma once

#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/flags.h"
#include "common/engine/engine_builder.h"
#include "common/metrics/process_metrics.h"

namespace grpc {
class ChannelCredentials;
class Server;
class ServerCredentials;
class Service;
}  // namespace grpc

namespace tandem {

// Flags shared by every command that runs an engine (serve, prefill, decode, worker).
struct EngineFlags {
  std::string model_dir;
  std::string dtype = "auto";
  std::string kv_dtype = "auto";
  std::string quantization = "none";
  int64_t quant_group_size = 128;
  std::string matmul_input_dtype = "auto";
  std::string kv_memory = "1GiB";
  std::string policy = "fcfs";
  int64_t threads = 0;
  int64_t block_size = 16;
  int64_t max_num_seqs = 64;
  int64_t max_batched_tokens = 512;
  int64_t max_model_len = 0;
  int64_t max_waiting = 4096;
  int64_t max_prefill_chunk = 0;
  int64_t num_kv_blocks = 0;
  bool no_prefix_cache = false;
  bool mmap_weights = false;
  std::string device = "cpu";
  double gpu_memory_utilization = 0.9;
  // Speculative decoding.
  std::string speculative_method = "none";
  int64_t num_speculative_tokens = 4;
  std::string draft_model;
  int64_t ngram_max = 4;
  int64_t ngram_min = 1;
  bool no_adaptive_speculation = false;

  EngineFlags();
  void Register(FlagSet* flags);
  absl::StatusOr<EngineBuildOptions> ToBuildOptions() const;
  // The same settings as command-line arguments (to start worker processes with them).
  std::vector<std::string> ToArgs() const;
};

// Flags of every gRPC server command, including where it serves /metrics.
struct ServerFlags {
  std::string host = "127.0.0.1";
  int64_t port = 0;
  std::string port_file;
  double drain_timeout_s = 60;
  bool log_json = false;
  MetricsOptions metrics;  // --metrics-host, --metrics-port, --metrics-port-file
  // TLS on every listener of the process (gRPC and HTTP) from PEM files; the same certificate
  // is the process's client identity when it dials workers. tls_ca verifies peers: workers'
  // certificates when dialing, clients' certificates when tls_client_auth (mTLS).
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
  bool tls_client_auth = false;

  void Register(FlagSet* flags, int64_t default_port);
  // The TLS flags as arguments (to start worker processes with them).
  std::vector<std::string> TlsArgs() const;
  // `metrics` with the TLS of the other listeners: /metrics over HTTPS when --tls-cert is set,
  // requiring a client certificate signed by --tls-ca when --tls-client-auth.
  MetricsOptions Metrics() const;
};

// Credentials of the process's listeners: TLS when --tls-cert is set, else plaintext.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerFlags& flags);
// Credentials to dial workers: TLS verifying against --tls-ca (and presenting --tls-cert) when
// --tls-ca is set, else plaintext.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ServerFlags& flags);

// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread and returns the first two; call it first
// thing, so that every thread started later inherits the mask and only sigwait sees the signals.
sigset_t BlockTerminationSignals();
// Waits for SIGTERM or SIGINT and returns it.
int WaitForTerminationSignal(const sigset_t& signals);

struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};
// Starts a gRPC server with health checking and reflection on host:port and writes the bound
// port to flags.port_file (atomically) when set.
absl::StatusOr<RunningServer> StartGrpcServer(const ServerFlags& flags,
                                              const std::vector<grpc::Service*>& services);

void WriteFileAtomically(const std::string& path, const std::string& content);

}  // namespace tandem
