#include "kvtransfer/control_rpc/front_door.h"

#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/log.h"

namespace tandem::kvtransfer {

// One admitted connection: the peer's TCP socket and the relay's Unix socket to gRPC, with a
// buffer per direction (up: peer -> gRPC, down: gRPC -> peer). Loop thread only.
struct FrontDoor::Relay {
  uint64_t id = 0;
  tcp::Fd client;
  tcp::Fd backend;
  std::string peer;
  std::string host;
  absl::Time deadline;         // InfiniteFuture once authenticated
  std::unique_ptr<char[]> up;  // allocated once admitted (charged)
  std::unique_ptr<char[]> down;
  size_t up_begin = 0, up_end = 0;
  size_t down_begin = 0, down_end = 0;
  bool client_eof = false;     // the peer sent its last byte; gRPC's side is shut once `up` is out
  bool backend_shut = false;   // shutdown(backend, SHUT_WR) done
  bool backend_eof = false;    // gRPC closed the connection: it ends once `down` is out
  uint32_t client_events = 0;  // what epoll watches now (0: not in the set)
  uint32_t backend_events = 0;
};

namespace {

// epoll data: the relay id with the side in its lowest bit; 0 the listener, 1 the wake fd.
constexpr uint64_t kListenTag = 0;
constexpr uint64_t kWakeTag = 1;
uint64_t Tag(uint64_t id, bool client_side) { return (id << 1) | (client_side ? 0 : 1); }

// Moves bytes from `from` into buf[end..) when buf is empty, and from buf[begin, end) to `to`:
// -1 on an error (the connection is done), else whether `from` reached EOF.
int Move(int from, int to, char* buf, size_t* begin, size_t* end, bool from_eof) {
  for (;;) {
    if (*begin < *end) {
      ssize_t n = send(to, buf + *begin, *end - *begin, MSG_NOSIGNAL);
      if (n > 0) {
        *begin += static_cast<size_t>(n);
        if (*begin == *end) *begin = *end = 0;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return from_eof ? 1 : 0;
      return -1;
    }
    if (from_eof) return 1;
    ssize_t n = recv(from, buf, kRelayBufferBytes, 0);
    if (n > 0) {
      *begin = 0;
      *end = static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return 1;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return -1;
  }
}

}  // namespace

FrontDoor::FrontDoor(const FrontDoorOptions& options)
    : options_(options), limiter_(options.limits) {}

absl::StatusOr<std::unique_ptr<FrontDoor>> FrontDoor::Start(const std::string& host, int port,
                                                            const FrontDoorOptions& options) {
  const ConnectionLimiter::Limits& l = options.limits;
  if (l.max_connections <= 0 || l.max_connections_per_peer <= 0) {
    return absl::InvalidArgumentError("kv control listener: connection caps must be positive");
  }
  if (l.memory_budget < l.max_connections * kRelayChargeBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv control listener: memory budget of ", l.memory_budget, " bytes is below what ",
        l.max_connections, " connections hold (", kRelayChargeBytes, " bytes each)"));
  }
  if (options.backend_path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return absl::InvalidArgumentError("kv control listener: backend socket path too long");
  }
  std::unique_ptr<FrontDoor> d(new FrontDoor(options));
  absl::StatusOr<tcp::Fd> fd = tcp::Listen(host, port, &d->port_);
  if (!fd.ok()) return fd.status();
  d->listen_fd_ = std::move(*fd);
  d->epoll_fd_ = tcp::Fd(epoll_create1(EPOLL_CLOEXEC));
  d->wake_fd_ = tcp::Fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!d->epoll_fd_.valid() || !d->wake_fd_.valid()) {
    return absl::InternalError(absl::StrCat("kv control listener: ", strerror(errno)));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenTag;
  epoll_ctl(d->epoll_fd_.get(), EPOLL_CTL_ADD, d->listen_fd_.get(), &ev);
  ev.data.u64 = kWakeTag;
  epoll_ctl(d->epoll_fd_.get(), EPOLL_CTL_ADD, d->wake_fd_.get(), &ev);
  d->loop_ = std::thread([p = d.get()] { p->Loop(); });
  return d;
}

FrontDoor::~FrontDoor() { Stop(); }

void FrontDoor::Stop() {
  if (stopping_.exchange(true)) return;
  const uint64_t one = 1;
  if (write(wake_fd_.get(), &one, sizeof one) < 0) {
    // The loop still sees stopping_ within its 100 ms wait.
  }
  if (loop_.joinable()) loop_.join();
  for (auto& [id, r] : relays_) limiter_.Leave(r->host, kRelayChargeBytes);
  relays_.clear();  // closes every socket
  listen_fd_.Reset();
}

void FrontDoor::WaitIdle(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (open() > 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
}

void FrontDoor::MarkAuthenticated(const std::string& grpc_peer) {
  // "unix-abstract:<prefix><id>" (the relay socket's abstract name, ServerContext::peer()).
  const size_t at = grpc_peer.rfind(options_.backend_name_prefix);
  if (options_.backend_name_prefix.empty() || at == std::string::npos) return;
  uint64_t id;
  if (!absl::SimpleAtoi(grpc_peer.substr(at + options_.backend_name_prefix.size()), &id)) return;
  std::lock_guard<std::mutex> lock(mu_);
  authenticated_.insert(id);
}

void FrontDoor::Loop() {
  pthread_setname_np(pthread_self(), "kvc-front");
  std::vector<epoll_event> events(64);
  while (!stopping_) {
    const int n = epoll_wait(epoll_fd_.get(), events.data(), static_cast<int>(events.size()), 100);
    for (int i = 0; i < n && !stopping_; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == kListenTag) {
        AcceptAll();
      } else if (tag == kWakeTag) {
        continue;
      } else {
        auto it = relays_.find(tag >> 1);
        if (it != relays_.end()) Pump(it->second.get(), events[i].events);
      }
    }
    CloseExpired(absl::Now());
  }
}

void FrontDoor::AcceptAll() {
  for (;;) {
    int fd = accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // EAGAIN, or out of descriptors: the next readiness tries again
    }
    auto r = std::make_unique<Relay>();
    r->client = tcp::Fd(fd);
    r->peer = tcp::PeerName(fd);
    r->host = PeerHost(r->peer);
    KvRefusal reason;
    absl::Status admitted = limiter_.Admit(r->host, kRelayChargeBytes, &reason);
    if (!admitted.ok()) {
      limiter_.NoteRefused(reason, r->peer, admitted, options_.hooks);
      continue;  // closed by ~Fd, before anything is read from it
    }
    r->up.reset(new char[kRelayBufferBytes]);
    r->down.reset(new char[kRelayBufferBytes]);
    r->id = next_id_++;
    r->deadline = absl::Now() + options_.handshake_timeout;
    // The relay's own end, bound to an abstract name gRPC reports as the call's peer.
    r->backend = tcp::Fd(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    bool connected = r->backend.valid();
    if (connected && !options_.backend_name_prefix.empty()) {
      const std::string name = absl::StrCat(options_.backend_name_prefix, r->id);
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      const size_t len = std::min(name.size(), sizeof a.sun_path - 2);
      memcpy(a.sun_path + 1, name.data(), len);
      connected = bind(r->backend.get(), reinterpret_cast<sockaddr*>(&a),
                       static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + len)) == 0;
    }
    if (connected) {
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      memcpy(a.sun_path, options_.backend_path.data(), options_.backend_path.size());
      connected = connect(r->backend.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    }
    if (!connected) {
      TLOG(WARNING) << "kv control listener: cannot reach its gRPC server for " << r->peer << ": "
                    << strerror(errno);
      limiter_.Leave(r->host, kRelayChargeBytes);
      continue;
    }
    Relay* p = r.get();
    relays_.emplace(p->id, std::move(r));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = Tag(p->id, true);
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, p->client.get(), &ev);
    ev.data.u64 = Tag(p->id, false);
    epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, p->backend.get(), &ev);
    p->client_events = p->backend_events = EPOLLIN;
  }
}

void FrontDoor::Pump(Relay* r, uint32_t events) {
  // A reset socket has nothing more to give or take. A hang-up is not an error: the socket still
  // holds what its peer wrote before closing (gRPC's last replies as it shuts down), read below
  // until EOF like any other end.
  if ((events & EPOLLERR) != 0) {
    Close(r);
    return;
  }
  const int up =
      Move(r->client.get(), r->backend.get(), r->up.get(), &r->up_begin, &r->up_end, r->client_eof);
  if (up < 0) {
    Close(r);
    return;
  }
  if (up == 1) {
    r->client_eof = true;
    if (!r->backend_shut && r->up_begin == r->up_end) {
      shutdown(r->backend.get(), SHUT_WR);  // gRPC sees the peer's end and closes
      r->backend_shut = true;
    }
  }
  const int down = Move(r->backend.get(), r->client.get(), r->down.get(), &r->down_begin,
                        &r->down_end, r->backend_eof);
  if (down < 0 || (down == 1 && r->down_begin == r->down_end)) {
    Close(r);  // gRPC ended the connection and everything it sent is out
    return;
  }
  if (down == 1) r->backend_eof = true;
  Watch(r);
}

void FrontDoor::Watch(Relay* r) {
  // Read a side only when the buffer it fills is empty; wait to write while one has bytes.
  const uint32_t client = (!r->client_eof && r->up_begin == r->up_end ? EPOLLIN : 0) |
                          (r->down_begin < r->down_end ? EPOLLOUT : 0);
  const uint32_t backend = (!r->backend_eof && r->down_begin == r->down_end ? EPOLLIN : 0) |
                           (r->up_begin < r->up_end ? EPOLLOUT : 0);
  SetInterest(r->client.get(), Tag(r->id, true), client, &r->client_events);
  SetInterest(r->backend.get(), Tag(r->id, false), backend, &r->backend_events);
}

void FrontDoor::SetInterest(int fd, uint64_t tag, uint32_t want, uint32_t* now) {
  // epoll reports a hang-up whatever the mask, so a side with nothing to wait for leaves the set
  // (a peer that hung up while the other side's buffer is full would spin the loop otherwise).
  if (want == *now) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = tag;
  const int op = want == 0 ? EPOLL_CTL_DEL : *now == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD;
  epoll_ctl(epoll_fd_.get(), op, fd, want == 0 ? nullptr : &ev);
  *now = want;
}

void FrontDoor::Close(Relay* r) {
  if (r->client_events != 0) epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, r->client.get(), nullptr);
  if (r->backend_events != 0) epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, r->backend.get(), nullptr);
  limiter_.Leave(r->host, kRelayChargeBytes);
  relays_.erase(r->id);  // closes both sockets
}

void FrontDoor::CloseExpired(absl::Time now) {
  std::set<uint64_t> marked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    marked.swap(authenticated_);
  }
  for (uint64_t id : marked) {
    auto it = relays_.find(id);
    if (it != relays_.end()) it->second->deadline = absl::InfiniteFuture();
  }
  std::vector<Relay*> expired;
  for (auto& [id, r] : relays_) {
    if (r->deadline <= now) expired.push_back(r.get());
  }
  for (Relay* r : expired) {
    limiter_.NoteRefused(KvRefusal::kHandshakeTimeout, r->peer,
                         absl::DeadlineExceededError(absl::StrCat(
                             "no authenticated control request within ",
                             absl::FormatDuration(options_.handshake_timeout), " of connecting")),
                         options_.hooks);
    Close(r);
  }
}

}  // namespace tandem::kvtransfer
