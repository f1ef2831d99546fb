#pragma once

// Hostile connections for the KV listeners' flood tests: TCP connections from a chosen loopback
// source address (127.0.0.0/8 is all local, so one machine plays many peers), and whether the
// listener still holds them.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

namespace tandem::kvtransfer::testing {

// A TCP connection to 127.0.0.1:port from `source` (a loopback address), or -1.
inline int ConnectFrom(const std::string& source, int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, source.c_str(), &a.sin_addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the listener still holds the connection: whatever it sent is read and dropped; EOF or
// a reset means it closed it.
inline bool StillOpen(int fd) {
  char buf[4096];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
}

inline int CountOpen(const std::vector<int>& fds) {
  int open = 0;
  for (int fd : fds) open += StillOpen(fd) ? 1 : 0;
  return open;
}

inline void CloseAll(std::vector<int>* fds) {
  for (int fd : *fds) close(fd);
  fds->clear();
}

// The HTTP/2 client preface and an empty SETTINGS frame: what a gRPC client sends first.
inline const std::string& Http2Preface() {
  static const std::string p =
      std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + std::string("\0\0\0\x04\0\0\0\0\0", 9);
  return p;
}

}  // namespace tandem::kvtransfer::testing
