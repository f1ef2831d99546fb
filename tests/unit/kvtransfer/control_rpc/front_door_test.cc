// The KV control front's relay (front_door.h) over real sockets, against a plain Unix-socket
// backend standing in for gRPC: bytes pass both ways unchanged, and a backend that writes its
// last reply and closes at once (gRPC shutting down) still gets every byte of it to a client that
// reads slowly; the relay then closes the connection.

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kvtransfer/control_rpc/front_door.h"
#include "tests/unit/kvtransfer/kv_test_util.h"

namespace tandem::kvtransfer {
namespace {

char PatternAt(size_t i) { return static_cast<char>(i * 131 + (i >> 12)); }

// Accepts one connection, reads one request byte, then writes until every buffer between it
// and the client is full (the client does not read yet), and closes at once: what it wrote last
// is still in its socket, and the relay is waiting for the client when it sees the end.
class OneShotBackend {
 public:
  OneShotBackend() {
    dir_ = absl::StrCat(::testing::TempDir(), "/front_door_test_", getpid());
    std::filesystem::create_directories(dir_);
    path_ = dir_ + "/sock";
    fd_ = tcp::Fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::memcpy(a.sun_path, path_.data(), path_.size());
    EXPECT_EQ(bind(fd_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << strerror(errno);
    EXPECT_EQ(listen(fd_.get(), 4), 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~OneShotBackend() {
    fd_.Shutdown();
    thread_.join();
    std::filesystem::remove_all(dir_);
  }
  const std::string& path() const { return path_; }
  // How many bytes it wrote before closing; 0 until it closed.
  size_t written() const { return written_; }

 private:
  void Serve() {
    tcp::Fd c(accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!c.valid()) return;
    char request;
    if (recv(c.get(), &request, 1, 0) != 1) return;
    std::string chunk(64 << 10, '\0');
    size_t sent = 0;
    for (;;) {
      for (size_t i = 0; i < chunk.size(); ++i) chunk[i] = PatternAt(sent + i);
      ssize_t n = send(c.get(), chunk.data(), chunk.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return;
      pollfd p{c.get(), POLLOUT, 0};
      if (poll(&p, 1, 300) == 0) break;  // nothing moved for 300 ms: everything is full
    }
    c.Reset();
    written_ = sent;
  }

  std::string dir_, path_;
  tcp::Fd fd_;
  std::thread thread_;
  std::atomic<size_t> written_{0};
};

TEST(FrontDoorRelayTest, ABackendThatClosesRightAfterItsReplyDeliversAllOfIt) {
  OneShotBackend backend;
  FrontDoorOptions o;
  o.limits = {8, 4, 8 * kRelayChargeBytes};
  o.backend_path = backend.path();
  o.handshake_timeout = absl::Seconds(60);
  auto door = FrontDoor::Start("127.0.0.1", 0, o);
  ASSERT_TRUE(door.ok()) << door.status();

  // A small receive window, so the relay holds bytes for the client when the backend closes.
  tcp::Fd client(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int window = 4096;
  setsockopt(client.get(), SOL_SOCKET, SO_RCVBUF, &window, sizeof window);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>((*door)->port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(client.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(send(client.get(), "?", 1, MSG_NOSIGNAL), 1);
  ASSERT_TRUE(testing::Eventually([&] { return backend.written() > 0; }, absl::Seconds(30)));

  std::string got;
  char buf[8192];
  for (;;) {
    ssize_t n = recv(client.get(), buf, sizeof buf, 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ASSERT_EQ(got.size(), backend.written());
  size_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) wrong += got[i] != PatternAt(i);
  EXPECT_EQ(wrong, 0u);
  // The relay closed the connection once everything was out, and let its slot go.
  EXPECT_TRUE(testing::Eventually([&] { return (*door)->open() == 0; }, absl::Seconds(10)));
}

}  // namespace
}  // namespace tandem::kvtransfer
