#pragma once

// Non-blocking TCP sockets where every wait is a poll() with a timeout: nothing here can hang.
// Scatter/gather I/O goes straight between the socket and the caller's buffers (the KV pool's
// regions), one syscall at a time, optionally under a caller's lock (see IoHooks).

#include <sys/uio.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::kvtransfer::tcp {

// Owns a file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset();
  // Wakes every thread blocked on the socket (their poll returns, reads see EOF); the fd stays
  // open until Reset, so no other thread can be handed the same number meanwhile.
  void Shutdown() const;

 private:
  int fd_ = -1;
};

// "host:port", "[v6]:port".
absl::Status SplitHostPort(const std::string& endpoint, std::string* host, int* port);

// A listening socket; `bound_port` receives the port (useful with port 0).
absl::StatusOr<Fd> Listen(const std::string& host, int port, int* bound_port);
// A connected, configured socket, or UNAVAILABLE (DEADLINE_EXCEEDED past `timeout`).
absl::StatusOr<Fd> Connect(const std::string& endpoint, absl::Duration timeout);
// Non-blocking, TCP_NODELAY, keepalive and TCP_USER_TIMEOUT so dead peers are noticed.
void ConfigureSocket(int fd, absl::Duration io_timeout);
std::string PeerName(int fd);

// A position inside a list of buffers.
class IovCursor {
 public:
  void Clear();
  // Buffers longer than kMaxPiece are split so each syscall can be capped (IoHooks).
  void Add(const void* data, size_t n);
  bool done() const { return index_ == iov_.size(); }
  size_t remaining() const;
  iovec* data() { return iov_.data() + index_; }
  // Buffers for the next syscall: at most IOV_MAX, and about `max_bytes` (0: no cap).
  int count(size_t max_bytes = 0) const;
  // Moves past `n` bytes, showing each run of them to `visit` first (may be null).
  void Advance(size_t n, const std::function<void(uint8_t*, size_t)>* visit = nullptr);
  // Redirects every byte not yet moved to `scratch` (reused as often as needed).
  void Retarget(uint8_t* scratch, size_t scratch_len);

  static constexpr size_t kMaxPiece = 256 << 10;

 private:
  std::vector<iovec> iov_;
  size_t index_ = 0;
};

// Optional hooks around each syscall of WriteAll / ReadAll.
// Guard: `mu` is held during each syscall, and once `valid()` (checked under `mu`) is false the
// rest of the transfer is redirected to `scratch` (writes send its bytes, reads discard into
// it), keeping the stream framed while never touching the caller's buffers again.
// `on_bytes` sees every run of bytes moved, right after the syscall moved it (still in cache;
// under `mu` while the guard holds; scratch bytes too after a redirect): the transports
// checksum there.
struct IoHooks {
  std::mutex* mu = nullptr;
  std::function<bool()> valid;
  uint8_t* scratch = nullptr;
  size_t scratch_len = 0;
  std::function<void(uint8_t*, size_t)> on_bytes;
  size_t max_bytes_per_call = 0;  // 0: no cap
  // The whole call fails with DEADLINE_EXCEEDED at this time, however the bytes trickle in.
  absl::Time deadline = absl::InfiniteFuture();
};

// Sends every byte of `cur`. UNAVAILABLE when the peer is gone, DEADLINE_EXCEEDED after
// `idle_timeout` without progress.
absl::Status WriteAll(int fd, IovCursor* cur, absl::Duration idle_timeout,
                      const IoHooks* hooks = nullptr);
// Fills every byte of `cur`. The first byte may take `first_byte_timeout` (infinite while a
// connection idles between messages), each later one `idle_timeout`.
absl::Status ReadAll(int fd, IovCursor* cur, absl::Duration idle_timeout,
                     const IoHooks* hooks = nullptr,
                     absl::Duration first_byte_timeout = absl::ZeroDuration());

absl::Status WriteBytes(int fd, const void* data, size_t n, absl::Duration idle_timeout);
absl::Status ReadBytes(int fd, void* data, size_t n, absl::Duration idle_timeout,
                       absl::Duration first_byte_timeout = absl::ZeroDuration());
// As above, and all of it done by `deadline` (DEADLINE_EXCEEDED then).
absl::Status WriteBytesBy(int fd, const void* data, size_t n, absl::Duration idle_timeout,
                          absl::Time deadline);
absl::Status ReadBytesBy(int fd, void* data, size_t n, absl::Duration idle_timeout,
                         absl::Time deadline);

}  // namespace tandem::kvtransfer::tcp
