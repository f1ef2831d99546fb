#pragma once

// The nccl and cuda-ipc transports' control channel over gRPC (service tandem.v1.KvControl): a
// decode worker serves it on its KV endpoint (--kv-host:--kv-port) with the process's TLS,
// handing each request to its KvReceiver::HandleControl; a prefill worker dials receivers'
// endpoints with MakeGrpcControlChannel. With a shared secret (--kv-secret-file) every request
// carries its time, a fresh nonce and ControlRequestProof over all three, and every reply
// ControlReplyProof (kvtransfer/auth.h): a request without the right proof, outside the time
// window or with a nonce seen before (a replay) is refused (UNAUTHENTICATED) before the
// receiver sees it, and a reply without the right proof is refused by the sender.

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/tls.h"
#include "kvtransfer/transport.h"

namespace grpc {
class Server;
}

namespace tandem::kvtransfer {

class KvControlService;

// What the control listener lets its peers hold (gRPC's own limits: it has no cap on
// connections). Control messages are small (the largest is a BEGIN or DATA naming its blocks).
struct KvControlLimits {
  int max_message_bytes = 1 << 20;            // a request larger than this is refused unread
  int64_t memory_budget = int64_t{64} << 20;  // gRPC's buffers of the listener, all calls
  int max_threads = 64;                       // threads serving calls at once
  int max_streams_per_connection = 16;        // calls in flight on one connection
  absl::Duration handshake_timeout = absl::Seconds(5);  // a connection's HTTP/2 (and TLS) setup
};

class KvControlServer {
 public:
  // Listens on host:port (0: a free port) with `tls` (plaintext when tls.cert is empty). With a
  // `secret`, requests are accepted within `replay_window` of their time, each nonce once.
  static absl::StatusOr<std::unique_ptr<KvControlServer>> Start(
      const std::string& host, int port, const TlsOptions& tls, std::string secret,
      absl::Duration replay_window = absl::Seconds(60),
      const KvControlLimits& limits = KvControlLimits());
  ~KvControlServer();  // Stop()
  int port() const { return port_; }
  // Where requests go; until set (and after Stop) they get UNAVAILABLE. Must outlive Stop().
  void SetReceiver(KvReceiver* receiver);
  void Stop();

 private:
  KvControlServer() = default;
  std::unique_ptr<KvControlService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

// "host:port" as senders on other machines dial it: `advertise_host`, else `host`, else (for a
// wildcard address) this machine's hostname; IPv6 literals bracketed. As tcp's endpoint().
std::string AdvertisedEndpoint(const std::string& host, const std::string& advertise_host,
                               int port);

// A ControlChannel dialing receivers' endpoints (host:port) with `tls`'s client credentials,
// one cached gRPC channel per endpoint. Each exchange has `timeout` (CONNECT waits for the
// receiver's communicator setup). gRPC failures map to their absl codes (unreachable:
// UNAVAILABLE).
absl::StatusOr<ControlChannel> MakeGrpcControlChannel(const TlsOptions& tls, std::string secret,
                                                      absl::Duration timeout = absl::Seconds(30));

}  // namespace tandem::kvtransfer
