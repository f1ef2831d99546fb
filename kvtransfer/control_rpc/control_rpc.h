#pragma once

// The nccl and cuda-ipc transports' control channel over gRPC (service tandem.v1.KvControl): a
// decode worker serves it on its KV endpoint (--kv-host:--kv-port) with the process's TLS,
// handing each request to its KvReceiver::HandleControl. The port itself belongs to a front
// (front_door.h) that caps connections in all and per peer address, charges each to a memory
// budget and relays the admitted ones to the gRPC server on a private Unix socket; a prefill worker
// dials receivers' endpoints with MakeGrpcControlChannel. With a shared secret (--kv-secret-file)
// every request carries its time, a fresh nonce and ControlRequestProof over all three, and every
// reply ControlReplyProof (kvtransfer/auth.h): a request without the right proof, outside the time
// window or with a nonce seen before (a replay) is refused (UNAUTHENTICATED) before the
// receiver sees it, and a reply without the right proof is refused by the sender.

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/tls.h"
#include "kvtransfer/transfer_hooks.h"
#include "kvtransfer/transport.h"

namespace grpc {
class Server;
}

namespace tandem::kvtransfer {

class KvControlService;
class FrontDoor;

// What the control listener lets its peers hold: the front's caps on connections (front_door.h;
// gRPC 1.51 has none) and gRPC's own limits. Control messages are small (the largest is a BEGIN
// or DATA naming its blocks).
struct KvControlLimits {
  int max_connections = 128;          // open at once, all peers (--kv-max-connections)
  int max_connections_per_peer = 32;  // from one peer address (--kv-max-connections-per-peer)
  // The front's relay buffers, kRelayChargeBytes per connection; at least max_connections' worth.
  int64_t connection_memory_budget = int64_t{8} << 20;
  int max_message_bytes = 1 << 20;            // a request larger than this is refused unread
  int64_t memory_budget = int64_t{64} << 20;  // gRPC's buffers of the listener, all calls
  int max_threads = 64;                       // threads serving calls at once
  int max_streams_per_connection = 16;        // calls in flight on one connection
  // From accept until the connection's first authenticated request (or, without a secret, its
  // first request): a connection that has not got that far is closed. Also gRPC's deadline on
  // a connection's TLS and HTTP/2 setup.
  absl::Duration handshake_timeout = absl::Seconds(5);
};

class KvControlServer {
 public:
  // Listens on host:port (0: a free port) with `tls` (plaintext when tls.cert is empty). With a
  // `secret`, requests are accepted within `replay_window` of their time, each nonce once.
  // Connections refused or closed for a limit are reported to `hooks` (may be null; must
  // outlive the server).
  static absl::StatusOr<std::unique_ptr<KvControlServer>> Start(
      const std::string& host, int port, const TlsOptions& tls, std::string secret,
      absl::Duration replay_window = absl::Seconds(60),
      const KvControlLimits& limits = KvControlLimits(), TransferHooks* hooks = nullptr);
  ~KvControlServer();  // Stop()
  int port() const { return port_; }
  // The front's connections now, those refused or closed for a limit so far, and the bytes
  // charged to connection_memory_budget now and at most.
  int open_connections() const;
  uint64_t connections_refused() const;
  int64_t connection_bytes() const;
  int64_t connection_bytes_peak() const;
  // Where requests go; until set (and after Stop) they get UNAVAILABLE. Must outlive Stop().
  void SetReceiver(KvReceiver* receiver);
  void Stop();

 private:
  KvControlServer() = default;
  std::unique_ptr<KvControlService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<FrontDoor> front_;
  std::string socket_dir_;  // the private directory of the gRPC server's Unix socket
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
