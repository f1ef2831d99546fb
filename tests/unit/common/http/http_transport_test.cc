#include "common/http/http_transport.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace tandem {
namespace {

// Counts what the transport reports, by reason / kind.
class CountingHooks : public HttpHooks {
 public:
  void ConnectionOpened() override { open_.fetch_add(1); }
  void ConnectionClosed() override { open_.fetch_sub(1); }
  void Rejected(std::string_view reason) override { Add("rejected " + std::string(reason)); }
  void TimedOut(std::string_view kind) override { Add("timeout " + std::string(kind)); }
  int Count(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    return counts_[key];
  }
  int open() const { return open_.load(); }
  std::string Dump() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out;
    for (const auto& [k, v] : counts_) out += k + "=" + std::to_string(v) + " ";
    return out;
  }

 private:
  void Add(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    ++counts_[key];
  }
  std::mutex mu_;
  std::map<std::string, int> counts_;
  std::atomic<int> open_{0};
};

int Connect(int port, int rcvbuf = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval tv{20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

void SendAll(int fd, const std::string& data) {
  ASSERT_EQ(send(fd, data.data(), data.size(), MSG_NOSIGNAL), static_cast<ssize_t>(data.size()));
}

// Reads until `until` appears (or the connection ends); returns what arrived.
std::string ReadUntil(int fd, const std::string& until) {
  std::string got;
  char buf[4096];
  while (got.find(until) == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

// True when the server closed the connection (EOF or reset) within the socket's timeout.
bool Closed(int fd) {
  char buf[4096];
  while (true) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

class HttpTransportTest : public ::testing::Test {
 protected:
  void Start(HttpTransportOptions o) {
    o.hooks = &hooks_;
    std::vector<HttpRoute> routes;
    routes.push_back({"GET", "/hello", [](const HttpRequest& req, auto res) {
                        res->Send(200, "text/plain", "hi " + req.get_header_value("x-name"));
                      }});
    routes.push_back({"GET", "/stream", [](const HttpRequest&, auto res) {
                        res->StartChunked(200, "text/event-stream");
                        for (const char* piece : {"a", "bb", "ccc"}) res->Write(piece);
                        res->Finish();
                      }});
    // Writes 4 KiB every 5 ms until the connection closes.
    routes.push_back({"GET", "/forever", [this](const HttpRequest&, auto res) {
                        res->StartChunked(200, "text/event-stream");
                        res->SetOnClose([this] { closed_streams_.fetch_add(1); });
                        res->SetTicker(absl::Milliseconds(5),
                                       [res] { res->Write(std::string(4096, 'x')); });
                      }});
    // Admitted on its headers only with "X-Key: yes"; the handler counts the bodies it got.
    routes.push_back({"POST", "/guarded",
                      [this](const HttpRequest& req, auto res) {
                        guarded_bodies_.fetch_add(1);
                        res->Send(200, "text/plain", std::to_string(req.body.size()));
                      },
                      [](const HttpRequest& head) -> std::optional<HttpRefusal> {
                        if (head.get_header_value("x-key") == "yes") return std::nullopt;
                        return HttpRefusal{401, "missing key", "unauthenticated"};
                      }});
    auto t = HttpTransport::Start(o, std::move(routes), [](int status, const std::string& m) {
      return "{\"status\": " + std::to_string(status) + ", \"message\": \"" + m + "\"}";
    });
    ASSERT_TRUE(t.ok()) << t.status();
    transport_ = std::move(t).value();
  }

  CountingHooks hooks_;
  std::atomic<int> closed_streams_{0};
  std::atomic<int> guarded_bodies_{0};
  std::unique_ptr<HttpTransport> transport_;
};

TEST_F(HttpTransportTest, KeepAliveChunkedAndErrorPages) {
  Start({});
  const int fd = Connect(transport_->port());
  SendAll(fd, "GET /hello HTTP/1.1\r\nX-Name: ann\r\n\r\n");
  std::string r = ReadUntil(fd, "hi ann");
  EXPECT_NE(r.find("HTTP/1.1 200 OK"), std::string::npos) << r;
  EXPECT_NE(r.find("Content-Length: 6"), std::string::npos) << r;
  SendAll(fd, "GET /stream HTTP/1.1\r\n\r\n");  // same connection
  r = ReadUntil(fd, "0\r\n\r\n");
  EXPECT_NE(r.find("Transfer-Encoding: chunked"), std::string::npos) << r;
  EXPECT_NE(r.find("1\r\na\r\n2\r\nbb\r\n3\r\nccc\r\n0\r\n\r\n"), std::string::npos) << r;
  SendAll(fd, "POST /hello HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  r = ReadUntil(fd, "}");
  EXPECT_NE(r.find("405"), std::string::npos) << r;
  EXPECT_NE(r.find("method not allowed"), std::string::npos) << r;
  SendAll(fd, "GET /nothing HTTP/1.1\r\n\r\n");
  r = ReadUntil(fd, "}");
  EXPECT_NE(r.find("404"), std::string::npos) << r;
  close(fd);
}

TEST_F(HttpTransportTest, RefusalsSayWhy) {
  HttpTransportOptions o;
  o.max_body_bytes = 1024;
  o.max_header_bytes = 1024;
  o.max_headers = 5;
  Start(o);
  int fd = Connect(transport_->port());
  SendAll(fd, "POST /hello HTTP/1.1\r\nContent-Length: 5000\r\n\r\n");
  std::string r = ReadUntil(fd, "}");
  EXPECT_NE(r.find("413"), std::string::npos) << r;
  EXPECT_NE(r.find("more than 1024 bytes"), std::string::npos) << r;
  EXPECT_TRUE(Closed(fd));
  close(fd);
  fd = Connect(transport_->port());
  SendAll(fd, "GET /hello HTTP/1.1\r\nX-Big: " + std::string(2000, 'a') + "\r\n\r\n");
  r = ReadUntil(fd, "}");
  EXPECT_NE(r.find("431"), std::string::npos) << r;
  close(fd);
  fd = Connect(transport_->port());
  SendAll(fd, "GET /hello HTTP/1.1\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\nF: 1\r\n\r\n");
  r = ReadUntil(fd, "}");
  EXPECT_NE(r.find("too many request headers"), std::string::npos) << r;
  close(fd);
  fd = Connect(transport_->port());
  SendAll(fd, "BLAH\r\n\r\n");
  r = ReadUntil(fd, "}");
  EXPECT_NE(r.find("400"), std::string::npos) << r;
  close(fd);
  EXPECT_EQ(hooks_.Count("rejected body_too_large"), 1);
  EXPECT_EQ(hooks_.Count("rejected header_too_large"), 1);
  EXPECT_EQ(hooks_.Count("rejected too_many_headers"), 1);
  EXPECT_EQ(hooks_.Count("rejected malformed"), 1);
}

TEST_F(HttpTransportTest, AdmissionRefusesOnTheHeadersBeforeTheBody) {
  HttpTransportOptions o;
  o.body_timeout_s = 30;  // a transport waiting for the body would not answer within the test
  Start(o);
  // A 1 MB body announced and never sent: refused at once, from the headers alone.
  int fd = Connect(transport_->port());
  SendAll(fd, "POST /guarded HTTP/1.1\r\nContent-Length: 1000000\r\n\r\n");
  std::string r = ReadUntil(fd, "}");
  EXPECT_NE(r.find("HTTP/1.1 401"), std::string::npos) << r;
  EXPECT_NE(r.find("missing key"), std::string::npos) << r;
  EXPECT_TRUE(Closed(fd));
  close(fd);
  // Also behind "Expect: 100-continue": no 100 Continue goes out, so no body is invited.
  fd = Connect(transport_->port());
  SendAll(fd, "POST /guarded HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
  r = ReadUntil(fd, "}");
  EXPECT_EQ(r.find("100 Continue"), std::string::npos) << r;
  EXPECT_NE(r.find("HTTP/1.1 401"), std::string::npos) << r;
  close(fd);
  EXPECT_EQ(guarded_bodies_.load(), 0) << "a refused request's body reached its handler";
  EXPECT_EQ(hooks_.Count("rejected unauthenticated"), 2) << hooks_.Dump();
  // Admitted: the body is read and handled.
  fd = Connect(transport_->port());
  SendAll(fd, "POST /guarded HTTP/1.1\r\nX-Key: yes\r\nContent-Length: 5\r\n\r\nhello");
  r = ReadUntil(fd, "\r\n\r\n5");
  EXPECT_NE(r.find("HTTP/1.1 200"), std::string::npos) << r;
  close(fd);
  EXPECT_EQ(guarded_bodies_.load(), 1);
}

TEST_F(HttpTransportTest, SlowClientsAreClosedOnTime) {
  HttpTransportOptions o;
  o.header_timeout_s = 0.3;
  o.body_timeout_s = 0.3;
  o.idle_timeout_s = 0.3;
  Start(o);
  const auto start = std::chrono::steady_clock::now();
  const int silent = Connect(transport_->port());
  const int partial = Connect(transport_->port());
  SendAll(partial, "GET /hello HTTP/1.1\r\nX-");
  const int slow_body = Connect(transport_->port());
  SendAll(slow_body, "POST /hello HTTP/1.1\r\nContent-Length: 100\r\n\r\nab");
  const int idle = Connect(transport_->port());
  SendAll(idle, "GET /hello HTTP/1.1\r\n\r\n");
  ReadUntil(idle, "hi ");
  for (int fd : {silent, partial, slow_body, idle}) {
    EXPECT_TRUE(Closed(fd));
    close(fd);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  // The stream's timer closes the socket before the failed read reports: wait for the counts.
  for (int i = 0; i < 500 && hooks_.Count("timeout header") + hooks_.Count("timeout body") +
                                     hooks_.Count("timeout idle") <
                                 4;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(hooks_.Count("timeout header"), 2) << hooks_.Dump();
  EXPECT_EQ(hooks_.Count("timeout body"), 1) << hooks_.Dump();
  EXPECT_EQ(hooks_.Count("timeout idle"), 1) << hooks_.Dump();
}

TEST_F(HttpTransportTest, ReaderThatStopsIsCutAndItsResponseToldOnce) {
  HttpTransportOptions o;
  o.max_buffered_bytes = 64 << 10;
  Start(o);
  const int fd = Connect(transport_->port(), /*rcvbuf=*/4096);
  SendAll(fd, "GET /forever HTTP/1.1\r\n\r\n");  // and never read
  for (int i = 0; i < 2000 && closed_streams_.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(closed_streams_.load(), 1);
  EXPECT_EQ(hooks_.Count("timeout buffer_overflow") + hooks_.Count("timeout write"), 1);
  close(fd);
}

TEST_F(HttpTransportTest, ConnectionLimitsAndStop) {
  HttpTransportOptions o;
  o.max_connections_per_client = 2;
  Start(o);
  const int a = Connect(transport_->port());
  const int b = Connect(transport_->port());
  SendAll(a, "GET /hello HTTP/1.1\r\n\r\n");
  ReadUntil(a, "hi ");
  const int c = Connect(transport_->port());
  EXPECT_TRUE(Closed(c));
  close(c);
  EXPECT_EQ(hooks_.Count("rejected per_client"), 1);
  SendAll(b, "GET /forever HTTP/1.1\r\n\r\n");
  ReadUntil(b, "xxxx");
  transport_->Stop();  // closes both; the stream hears of it
  EXPECT_EQ(closed_streams_.load(), 1);
  EXPECT_TRUE(Closed(a));
  close(a);
  close(b);
  EXPECT_EQ(hooks_.open(), 0);
}

}  // namespace
}  // namespace tandem
