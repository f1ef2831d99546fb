#include "common/cuda/emulation/fake_nccl.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

namespace {

constexpr char kMagic[8] = "TNDMNC1";
constexpr auto kInitTimeout = std::chrono::seconds(30);

struct IdBody {
  char magic[8];
  uint64_t token;
  uint16_t port;
};
static_assert(sizeof(IdBody) <= NCCL_UNIQUE_ID_BYTES);

std::atomic<uint64_t> g_sends{0};
std::atomic<uint64_t> g_recvs{0};

// Listeners of the ids this process drew, by token, until a rank of this process accepts.
std::mutex g_mu;
std::map<uint64_t, int>& Listeners() {
  static auto* m = new std::map<uint64_t, int>();
  return *m;
}

struct State {
  std::atomic<int> fd{-1};
  std::atomic<ncclResult_t> error{ncclInProgress};
  std::atomic<bool> aborted{false};
  ~State() {
    if (fd >= 0) close(fd);
  }
  void Fail(ncclResult_t r) {
    ncclResult_t expected = ncclSuccess;
    if (!error.compare_exchange_strong(expected, r)) {
      expected = ncclInProgress;
      error.compare_exchange_strong(expected, r);
    }
  }
};

// Polls `fd` for `events` in 50 ms slices until ready, aborted or past `deadline`.
bool WaitFd(State* s, int fd, short events, std::chrono::steady_clock::time_point deadline) {
  while (!s->aborted) {
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, 50);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
    if (std::chrono::steady_clock::now() >= deadline) return false;
  }
  return false;
}

bool WriteAll(State* s, int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || s->aborted) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool ReadAll(State* s, int fd, void* data, size_t bytes) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = recv(fd, p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || s->aborted) return false;
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

// The connection of one rank: the id's owner accepts on its listener, the other connects; each
// side sends the token and checks the peer's.
void Connect(std::shared_ptr<State> s, IdBody id) {
  const auto deadline = std::chrono::steady_clock::now() + kInitTimeout;
  int listener = -1;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = Listeners().find(id.token);
    if (it != Listeners().end()) {
      listener = it->second;
      Listeners().erase(it);
    }
  }
  int fd = -1;
  if (listener >= 0) {
    if (WaitFd(s.get(), listener, POLLIN, deadline)) fd = accept(listener, nullptr, nullptr);
    close(listener);
  } else {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(id.port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      close(fd);
      fd = -1;
    }
  }
  if (fd < 0) {
    s->Fail(ncclSystemError);
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  s->fd = fd;
  uint64_t theirs = 0;
  if (!WriteAll(s.get(), fd, &id.token, sizeof id.token) ||
      !WaitFd(s.get(), fd, POLLIN, deadline) || !ReadAll(s.get(), fd, &theirs, sizeof theirs) ||
      theirs != id.token) {
    s->Fail(ncclSystemError);
    return;
  }
  ncclResult_t expected = ncclInProgress;
  s->error.compare_exchange_strong(expected, ncclSuccess);
}

}  // namespace

struct ncclComm {
  std::shared_ptr<State> state;
  std::thread init;
};

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error (emulated NCCL: the peer's connection failed)";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
  }
  return "unknown result code";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* unique_id) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return ncclSystemError;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 4) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return ncclSystemError;
  }
  IdBody id{};
  std::memcpy(id.magic, kMagic, sizeof kMagic);
  std::random_device rd;
  id.token = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
             static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  id.port = ntohs(a.sin_port);
  std::memset(unique_id->internal, 0, sizeof unique_id->internal);
  std::memcpy(unique_id->internal, &id, sizeof id);
  std::lock_guard<std::mutex> lock(g_mu);
  Listeners()[id.token] = fd;
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId unique_id, int rank,
                                    ncclConfig_t* config) {
  IdBody id;
  std::memcpy(&id, unique_id.internal, sizeof id);
  if (nranks != 2 || rank < 0 || rank > 1 || std::memcmp(id.magic, kMagic, sizeof kMagic) != 0) {
    return ncclInvalidArgument;
  }
  auto* c = new ncclComm;
  c->state = std::make_shared<State>();
  c->init = std::thread(Connect, c->state, id);
  *comm = c;
  if (config == nullptr || config->blocking) {
    c->init.join();
    return c->state->error.load();
  }
  return ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr) return ncclInvalidArgument;
  *async_error = comm->state->error.load();
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return comm == nullptr ? ncclInvalidArgument : ncclSuccess;
}

namespace {
ncclResult_t Release(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  comm->state->aborted = true;
  const int fd = comm->state->fd.load();
  if (fd >= 0) shutdown(fd, SHUT_RDWR);  // unblocks a send or receive in progress
  if (comm->init.joinable()) comm->init.join();
  delete comm;  // the state lives on in operations still queued on a stream
  return ncclSuccess;
}
}  // namespace

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return Release(comm); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return Release(comm); }

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  if (comm == nullptr || peer < 0 || peer > 1) return ncclInvalidArgument;
  std::shared_ptr<State> s = comm->state;
  if (s->error.load() != ncclSuccess) return s->error.load();
  g_sends.fetch_add(1, std::memory_order_relaxed);
  tandem::cuda_emu::StreamEnqueueAsync(stream, [s, sendbuff, count] {
    if (s->error.load() != ncclSuccess) return;
    const uint64_t n = count;  // each send is framed by its size, so a recv can check it
    if (!WriteAll(s.get(), s->fd, &n, sizeof n) || !WriteAll(s.get(), s->fd, sendbuff, count)) {
      s->Fail(ncclRemoteError);
    }
  });
  return ncclSuccess;
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  if (comm == nullptr || peer < 0 || peer > 1) return ncclInvalidArgument;
  std::shared_ptr<State> s = comm->state;
  if (s->error.load() != ncclSuccess) return s->error.load();
  g_recvs.fetch_add(1, std::memory_order_relaxed);
  tandem::cuda_emu::StreamEnqueueAsync(stream, [s, recvbuff, count] {
    if (s->error.load() != ncclSuccess) return;
    uint64_t n = 0;
    if (!ReadAll(s.get(), s->fd, &n, sizeof n)) {
      s->Fail(ncclRemoteError);
    } else if (n != count) {  // NCCL requires a send and its recv to match in size
      s->Fail(ncclInvalidUsage);
      shutdown(s->fd, SHUT_RDWR);
    } else if (!ReadAll(s.get(), s->fd, recvbuff, count)) {
      s->Fail(ncclRemoteError);
    }
  });
  return ncclSuccess;
}

uint64_t FakeNcclSendCalls() { return g_sends.load(); }
uint64_t FakeNcclRecvCalls() { return g_recvs.load(); }

ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }
