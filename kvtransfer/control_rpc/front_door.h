#pragma once

// The control listener's TCP front (README.md, "Bounds"). gRPC 1.51 cannot cap a server's
// connections, so the KvControl gRPC server listens only on a Unix socket in a private 0700
// directory, and this front owns the public KV port: it accepts each TCP connection, admits it
// through a ConnectionLimiter (total and per-peer-address caps, kRelayChargeBytes charged to the
// memory budget) before reading a byte of it, and relays the admitted ones byte for byte to the
// gRPC server (TLS, when on, runs end to end through the relay, between the peer and gRPC). A
// relayed connection must carry an authenticated request (MarkAuthenticated) within the
// handshake deadline of its accept, else it is closed, so a peer without the secret holds a
// slot for that long at most; gRPC's own handshake timeout bounds its TLS and HTTP/2 setup too.
//
// Threads: one, the relay loop (epoll: accepts, both directions of every connection, deadlines).
// MarkAuthenticated may be called from any thread.

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/connection_limiter.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/transfer_hooks.h"

namespace tandem::kvtransfer {

inline constexpr int64_t kRelayBufferBytes = 16 << 10;  // each direction of a connection
// What one relayed connection is charged: its two buffers and its bookkeeping.
inline constexpr int64_t kRelayChargeBytes = 2 * kRelayBufferBytes + (4 << 10);

struct FrontDoorOptions {
  ConnectionLimiter::Limits limits;
  // From accept until its first authenticated request; then the connection may idle.
  absl::Duration handshake_timeout = absl::Seconds(5);
  // Where the gRPC server listens ("/dir/socket", a Unix socket path).
  std::string backend_path;
  // Abstract-namespace prefix the relay's backend sockets bind to; each gets
  // "<prefix><connection id>", which gRPC reports as the call's peer (BackendPeerId).
  std::string backend_name_prefix;
  TransferHooks* hooks = nullptr;  // refusals (may be null)
};

class FrontDoor {
 public:
  // Listens on host:port (0: a free port) and starts the relay loop.
  static absl::StatusOr<std::unique_ptr<FrontDoor>> Start(const std::string& host, int port,
                                                          const FrontDoorOptions& options);
  ~FrontDoor();  // Stop()
  FrontDoor(const FrontDoor&) = delete;
  FrontDoor& operator=(const FrontDoor&) = delete;

  int port() const { return port_; }
  // Closes the listener and every connection; idempotent.
  void Stop();
  // Waits until no connection is relayed (each closes once gRPC closed its end and what it
  // wrote went out) or `timeout` passed: before Stop, so that a server shutting down delivers the
  // replies of the calls it finished.
  void WaitIdle(absl::Duration timeout) const;

  // The connection whose backend socket gRPC names `grpc_peer` (ServerContext::peer()) carried
  // an authenticated request: it may stay past the handshake deadline. Unknown peers are ignored.
  void MarkAuthenticated(const std::string& grpc_peer);

  int open() const { return limiter_.open(); }  // connections relayed now
  uint64_t refused() const { return limiter_.refused(); }
  int64_t charged() const { return limiter_.charged(); }
  int64_t charged_peak() const { return limiter_.peak(); }

 private:
  struct Relay;
  explicit FrontDoor(const FrontDoorOptions& options);
  void Loop();
  void AcceptAll();
  // Moves what both directions of `r` can move now (epoll reported `events` on one side).
  void Pump(Relay* r, uint32_t events);
  void Watch(Relay* r);
  // Makes epoll watch `fd` for `want` (0: removes it), given it watches `*now`.
  void SetInterest(int fd, uint64_t tag, uint32_t want, uint32_t* now);
  void Close(Relay* r);
  void CloseExpired(absl::Time now);

  const FrontDoorOptions options_;
  ConnectionLimiter limiter_;
  tcp::Fd listen_fd_;
  tcp::Fd epoll_fd_;
  tcp::Fd wake_fd_;  // eventfd: Stop
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread loop_;
  // Loop thread only, except authenticated_ (under mu_).
  uint64_t next_id_ = 1;
  std::map<uint64_t, std::unique_ptr<Relay>> relays_;
  std::mutex mu_;
  std::set<uint64_t> authenticated_;  // ids marked, not yet seen by the loop
};

}  // namespace tandem::kvtransfer
