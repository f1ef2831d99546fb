#include "kvtransfer/tcp/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer::tcp {
namespace {

absl::Status Errno(const std::string& what, int err) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(err)));
}

int PollMillis(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return -1;
  if (d <= absl::ZeroDuration()) return 0;
  int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(d, absl::Milliseconds(1)));
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

// Waits until `fd` is ready for `events`; OK, DEADLINE_EXCEEDED or UNAVAILABLE.
absl::Status WaitReady(int fd, short events, absl::Duration timeout) {
  const absl::Time deadline =
      timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
  while (true) {
    pollfd p{fd, events, 0};
    int r = poll(&p, 1, PollMillis(deadline - absl::Now()));
    if (r > 0) return absl::OkStatus();  // errors and hangups surface in the next syscall
    if (r == 0) {
      if (absl::Now() < deadline) continue;
      return absl::DeadlineExceededError(
          absl::StrCat("socket made no progress for ", absl::FormatDuration(timeout)));
    }
    if (errno != EINTR) return Errno("poll", errno);
  }
}

absl::Status Transfer(int fd, bool write, IovCursor* cur, absl::Duration idle_timeout,
                      const IoHooks* hooks, absl::Duration first_byte_timeout) {
  static const IoHooks kNoHooks;
  const IoHooks& h = hooks != nullptr ? *hooks : kNoHooks;
  const std::function<void(uint8_t*, size_t)>* visit = h.on_bytes ? &h.on_bytes : nullptr;
  bool first = true;
  bool redirected = false;
  while (!cur->done()) {
    ssize_t n;
    int err = 0;
    {
      std::unique_lock<std::mutex> lock;
      if (h.mu != nullptr && !redirected) {
        lock = std::unique_lock<std::mutex>(*h.mu);
        if (!h.valid()) {
          // The rest goes to / comes from scratch; on_bytes still sees it, so the message's
          // checksum stays that of the bytes on the wire (a sender that ended a transfer
          // mid-message sends zeros the receiver accepts under a matching CRC, until the
          // ABORT behind them ends the attempt: never a spurious DATA_LOSS).
          cur->Retarget(h.scratch, h.scratch_len);
          redirected = true;
          lock.unlock();
        }
      }
      msghdr msg{};
      msg.msg_iov = cur->data();
      msg.msg_iovlen = static_cast<size_t>(cur->count(h.max_bytes_per_call));
      n = write ? sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) : recvmsg(fd, &msg, MSG_DONTWAIT);
      if (n < 0) err = errno;
      if (n > 0) cur->Advance(static_cast<size_t>(n), visit);
    }
    if (n > 0) {
      first = false;
      continue;
    }
    if (n == 0 && !write) return absl::UnavailableError("connection closed by peer");
    if (n < 0 && err == EINTR) continue;
    if (n < 0 && err != EAGAIN && err != EWOULDBLOCK) {
      return Errno(write ? "send" : "recv", err);
    }
    absl::Duration wait = idle_timeout;
    if (first && first_byte_timeout != absl::ZeroDuration()) wait = first_byte_timeout;
    bool by_deadline = false;
    if (h.deadline != absl::InfiniteFuture()) {
      const absl::Duration left = h.deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError("socket operation passed its deadline");
      }
      if (left < wait) {
        wait = left;
        by_deadline = true;
      }
    }
    absl::Status s = WaitReady(fd, write ? POLLOUT : POLLIN, wait);
    if (absl::IsDeadlineExceeded(s) && by_deadline) {
      return absl::DeadlineExceededError("socket operation passed its deadline");
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    Reset();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Fd::Reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void Fd::Shutdown() const {
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
}

absl::Status SplitHostPort(const std::string& endpoint, std::string* host, int* port) {
  size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon + 1 == endpoint.size()) {
    return absl::InvalidArgumentError(absl::StrCat("endpoint '", endpoint, "' is not host:port"));
  }
  std::string h = endpoint.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  int p;
  if (!absl::SimpleAtoi(endpoint.substr(colon + 1), &p) || p <= 0 || p > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("endpoint '", endpoint, "' has a bad port"));
  }
  *host = h;
  *port = p;
  return absl::OkStatus();
}

absl::StatusOr<Fd> Listen(const std::string& host, int port, int* bound_port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("resolve ", host, ": ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError("no address to listen on");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    Fd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) {
      last = Errno("socket", errno);
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd.get(), 128) != 0) {
      last = Errno(absl::StrCat("listen on ", host, ":", port), errno);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
    *bound_port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                           : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  return last;
}

absl::StatusOr<Fd> Connect(const std::string& endpoint, absl::Duration timeout) {
  std::string host;
  int port;
  absl::Status s = SplitHostPort(endpoint, &host, &port);
  if (!s.ok()) return s;
  const absl::Time deadline = absl::Now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("resolve ", host, ": ", gai_strerror(rc)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("no address for ", endpoint));
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    Fd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) {
      last = Errno("socket", errno);
      continue;
    }
    if (connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        last = Errno(absl::StrCat("connect to ", endpoint), errno);
        continue;
      }
      absl::Status ready = WaitReady(fd.get(), POLLOUT, deadline - absl::Now());
      if (!ready.ok()) {
        last = absl::DeadlineExceededError(absl::StrCat("connect to ", endpoint, " timed out"));
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        last = Errno(absl::StrCat("connect to ", endpoint), err);
        continue;
      }
    }
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  return last;
}

void ConfigureSocket(int fd, absl::Duration io_timeout) {
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  int idle = 5, interval = 1, count = 5;
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
  // Unacknowledged data older than this breaks the connection (a vanished peer).
  unsigned user_timeout = static_cast<unsigned>(
      std::clamp<int64_t>(absl::ToInt64Milliseconds(io_timeout), 1000, 600000));
  setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout, sizeof user_timeout);
}

std::string PeerName(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return ss.ss_family == AF_INET6 ? absl::StrCat("[", host, "]:", serv)
                                  : absl::StrCat(host, ":", serv);
}

void IovCursor::Clear() {
  iov_.clear();
  index_ = 0;
}

void IovCursor::Add(const void* data, size_t n) {
  auto* p = static_cast<uint8_t*>(const_cast<void*>(data));
  while (n > 0) {
    const size_t piece = std::min(n, kMaxPiece);
    iov_.push_back(iovec{p, piece});
    p += piece;
    n -= piece;
  }
}

size_t IovCursor::remaining() const {
  size_t n = 0;
  for (size_t i = index_; i < iov_.size(); ++i) n += iov_[i].iov_len;
  return n;
}

int IovCursor::count(size_t max_bytes) const {
  const size_t available = std::min<size_t>(iov_.size() - index_, IOV_MAX);
  if (max_bytes == 0) return static_cast<int>(available);
  size_t n = 1, bytes = iov_[index_].iov_len;
  while (n < available && bytes + iov_[index_ + n].iov_len <= max_bytes) {
    bytes += iov_[index_ + n].iov_len;
    ++n;
  }
  return static_cast<int>(n);
}

void IovCursor::Advance(size_t n, const std::function<void(uint8_t*, size_t)>* visit) {
  while (n > 0 && index_ < iov_.size()) {
    iovec& v = iov_[index_];
    const size_t step = std::min(n, v.iov_len);
    if (visit != nullptr) (*visit)(static_cast<uint8_t*>(v.iov_base), step);
    v.iov_base = static_cast<uint8_t*>(v.iov_base) + step;
    v.iov_len -= step;
    n -= step;
    if (v.iov_len == 0) ++index_;
  }
}

void IovCursor::Retarget(uint8_t* scratch, size_t scratch_len) {
  size_t left = remaining();
  iov_.clear();
  index_ = 0;
  while (left > 0) {
    size_t n = std::min(left, scratch_len);
    iov_.push_back(iovec{scratch, n});
    left -= n;
  }
}

absl::Status WriteAll(int fd, IovCursor* cur, absl::Duration idle_timeout, const IoHooks* hooks) {
  return Transfer(fd, /*write=*/true, cur, idle_timeout, hooks, absl::ZeroDuration());
}

absl::Status ReadAll(int fd, IovCursor* cur, absl::Duration idle_timeout, const IoHooks* hooks,
                     absl::Duration first_byte_timeout) {
  return Transfer(fd, /*write=*/false, cur, idle_timeout, hooks, first_byte_timeout);
}

absl::Status WriteBytes(int fd, const void* data, size_t n, absl::Duration idle_timeout) {
  IovCursor cur;
  cur.Add(data, n);
  return WriteAll(fd, &cur, idle_timeout);
}

absl::Status ReadBytes(int fd, void* data, size_t n, absl::Duration idle_timeout,
                       absl::Duration first_byte_timeout) {
  IovCursor cur;
  cur.Add(data, n);
  return ReadAll(fd, &cur, idle_timeout, nullptr, first_byte_timeout);
}

absl::Status WriteBytesBy(int fd, const void* data, size_t n, absl::Duration idle_timeout,
                          absl::Time deadline) {
  IovCursor cur;
  cur.Add(data, n);
  IoHooks hooks;
  hooks.deadline = deadline;
  return WriteAll(fd, &cur, idle_timeout, &hooks);
}

absl::Status ReadBytesBy(int fd, void* data, size_t n, absl::Duration idle_timeout,
                         absl::Time deadline) {
  IovCursor cur;
  cur.Add(data, n);
  IoHooks hooks;
  hooks.deadline = deadline;
  return ReadAll(fd, &cur, idle_timeout, &hooks);
}

}  // namespace tandem::kvtransfer::tcp
