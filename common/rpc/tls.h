#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace grpc {
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace tandem {

// TLS of a process from PEM files (--tls-* flags, ServerOptions). The same certificate serves
// every listener (gRPC, HTTP, /metrics) and is the process's client identity when it dials
// workers. `ca` verifies peers: workers' certificates when dialing, clients' certificates when
// client_auth (mTLS).
struct TlsOptions {
  std::string cert;
  std::string key;
  std::string ca;
  bool client_auth = false;

  // The same settings as command-line arguments (to start worker processes with them).
  std::vector<std::string> ToArgs() const;
};

struct CallPolicy;

// Credentials of the process's listeners: TLS when `cert` is set, else plaintext; either way
// every call passes `policy` (common/rpc/call_auth.h; must not be null) before its handler.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsOptions& tls, std::shared_ptr<const CallPolicy> policy);
// Credentials to dial workers: TLS verifying against `ca` (and presenting `cert`) when `ca` is
// set, else plaintext.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsOptions& tls);

}  // namespace tandem
