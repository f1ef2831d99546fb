// The KvControl listener's bounds (nccl and cuda-ipc's control port, front_door.h) under
// connection floods over real sockets: connections over the per-address cap and the total cap
// are closed at once, before anything is read; connections that carry no authenticated request
// are closed at the handshake deadline; an honest sender's control exchanges keep succeeding
// during every flood (plaintext and mTLS); the listener's memory stays bounded. Floods come from
// other loopback addresses (127.0.0.2...), the honest sender from 127.0.0.1.

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtransfer/auth.h"
#include "kvtransfer/control_rpc/control_rpc.h"
#include "kvtransfer/control_rpc/front_door.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/unit/kvtransfer/control_rpc/echo_receiver.h"
#include "tests/unit/kvtransfer/flood_peer.h"
#include "tests/util/sanitizer.h"

namespace tandem::kvtransfer {
namespace {

using testing::CloseAll;
using testing::ConnectFrom;
using testing::CountOpen;
using testing::EchoReceiver;
using testing::Http2Preface;

constexpr char kSecret[] = "0123456789abcdef-secret";

int64_t RssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}

class ControlLimitsTest : public ::testing::Test {
 protected:
  void Start(const TlsOptions& tls = TlsOptions()) {
    limits_.max_connections = 8;
    limits_.max_connections_per_peer = 3;
    limits_.handshake_timeout = absl::Milliseconds(1500);
    auto server = KvControlServer::Start("127.0.0.1", 0, tls, kSecret, absl::Seconds(60), limits_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    server_->SetReceiver(&receiver_);
    endpoint_ = absl::StrCat("127.0.0.1:", server_->port());
    TlsOptions client = tls;
    client.client_auth = false;
    auto channel = MakeGrpcControlChannel(client, kSecret, absl::Seconds(5));
    ASSERT_TRUE(channel.ok()) << channel.status();
    honest_ = *std::move(channel);
  }
  void TearDown() override {
    CloseAll(&flood_);
    if (server_ != nullptr) server_->Stop();
  }

  // One honest control exchange (a fresh nonce and proof each), as a prefill worker sends it.
  void ExpectHonestExchange(const std::string& what) {
    absl::StatusOr<std::string> reply = honest_(endpoint_, what);
    ASSERT_TRUE(reply.ok()) << what << ": " << reply.status();
    EXPECT_EQ(*reply, "echo:" + what);
  }

  // One exchange on a connection of its own (gRPC otherwise shares one between channels to the
  // same address), its request proven with `secret`.
  grpc::Status OwnConnectionExchange(const std::string& secret, const std::string& what) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto stub = v1::KvControl::NewStub(
        grpc::CreateCustomChannel(endpoint_, grpc::InsecureChannelCredentials(), args));
    v1::KvControlMessage m, reply;
    m.set_message(what);
    m.set_nonce(*NewNonce());
    m.set_unix_ms(absl::ToUnixMillis(absl::Now()));
    m.set_proof(ControlRequestProof(secret, m.unix_ms(), m.nonce(), what));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Status st = stub->Exchange(&context, m, &reply);
    if (st.ok()) EXPECT_EQ(reply.message(), "echo:" + what);
    own_channels_.push_back(std::move(stub));  // keeps the connection open
    return st;
  }

  // `n` connections from `source`, each sending `first` (may be empty), kept in flood_.
  void Flood(const std::string& source, int n, const std::string& first = std::string()) {
    for (int i = 0; i < n; ++i) {
      int fd = ConnectFrom(source, server_->port());
      ASSERT_GE(fd, 0) << "connect from " << source;
      if (!first.empty()) {
        ASSERT_EQ(send(fd, first.data(), first.size(), MSG_NOSIGNAL),
                  static_cast<ssize_t>(first.size()));
      }
      flood_.push_back(fd);
    }
  }
  static void Settle() { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

  KvControlLimits limits_;
  EchoReceiver receiver_;
  std::unique_ptr<KvControlServer> server_;
  std::string endpoint_;
  ControlChannel honest_;
  std::vector<int> flood_;
  std::vector<std::unique_ptr<v1::KvControl::Stub>> own_channels_;
};

TEST_F(ControlLimitsTest, FloodFromOneAddressIsCutAtItsCapAndAnHonestPeerIsServed) {
  Start();
  ExpectHonestExchange("before");
  Flood("127.0.0.2", 20, Http2Preface());
  Settle();
  EXPECT_EQ(CountOpen(flood_), limits_.max_connections_per_peer)
      << "connections from one address beyond its cap must be closed at once";
  EXPECT_GE(server_->connections_refused(), 17u);
  EXPECT_EQ(server_->open_connections(), limits_.max_connections_per_peer + 1);  // + honest
  for (int i = 0; i < 20; ++i) ExpectHonestExchange(absl::StrCat("during ", i));
  // A new honest connection from another address is admitted during the flood.
  grpc::Status fresh = OwnConnectionExchange(kSecret, "fresh");
  EXPECT_TRUE(fresh.ok()) << fresh.error_message();
  EXPECT_EQ(server_->open_connections(), limits_.max_connections_per_peer + 2);
}

TEST_F(ControlLimitsTest, FloodFromManyAddressesIsCutAtTheTotalCap) {
  Start();
  ExpectHonestExchange("before");  // an established, authenticated connection
  for (int a = 2; a <= 6; ++a) Flood(absl::StrCat("127.0.0.", a), 3);
  Settle();
  EXPECT_EQ(CountOpen(flood_), limits_.max_connections - 1)
      << "the total cap holds across addresses (one slot is the honest connection's)";
  EXPECT_EQ(server_->open_connections(), limits_.max_connections);
  for (int i = 0; i < 10; ++i) ExpectHonestExchange(absl::StrCat("during ", i));
}

TEST_F(ControlLimitsTest, ConnectionsWithoutAnAuthenticatedRequestAreClosedAtTheDeadline) {
  Start();
  ExpectHonestExchange("before");
  Flood("127.0.0.2", 2, Http2Preface());  // HTTP/2 set up, no request: no proof of the secret
  Flood("127.0.0.3", 2);                  // nothing at all
  Settle();
  // Unauthenticated requests on a connection of their own do not earn it a reprieve.
  EXPECT_EQ(OwnConnectionExchange("another-secret-0123456789", "forged").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(CountOpen(flood_), 4);
  EXPECT_EQ(server_->open_connections(), 6);
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_EQ(CountOpen(flood_), 0) << "past the handshake deadline without an authenticated request";
  EXPECT_EQ(server_->open_connections(), 1) << "only the honest, authenticated connection stays";
  ExpectHonestExchange("after");
  EXPECT_EQ(server_->open_connections(), 1) << "the honest connection was not replaced";
}

TEST_F(ControlLimitsTest, MemoryStaysBoundedUnderAFloodFromManyAddresses) {
  Start();
  ExpectHonestExchange("before");
  const int64_t rss_before = RssBytes();
  // 48 addresses x 8 connections: half set up HTTP/2 and then hold their connection, half write
  // 256 KiB of garbage after the preface.
  const std::string junk = Http2Preface() + std::string(256 << 10, 'x');
  std::vector<std::thread> writers;
  std::vector<std::vector<int>> fds(8);
  for (int t = 0; t < 8; ++t) {
    writers.emplace_back([&, t] {
      for (int a = 0; a < 6; ++a) {
        const std::string source = absl::StrCat("127.0.", 10 + t, ".", 1 + a);
        for (int i = 0; i < 8; ++i) {
          int fd = ConnectFrom(source, server_->port());
          if (fd < 0) continue;
          fds[t].push_back(fd);
          const std::string& first = i % 2 == 0 ? Http2Preface() : junk;
          send(fd, first.data(), first.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        }
      }
    });
  }
  for (int i = 0; i < 20; ++i) ExpectHonestExchange(absl::StrCat("during ", i));
  for (auto& w : writers) w.join();
  Settle();
  const int64_t rss_during = RssBytes();
  int held = 0;
  for (auto& v : fds) held += CountOpen(v);
  std::cout << "rss before " << rss_before / 1024 << " KiB, during the flood " << rss_during / 1024
            << " KiB; flood connections held " << held << ", refused "
            << server_->connections_refused() << "\n";
  EXPECT_LT(held, limits_.max_connections) << "the total cap holds (one slot is the honest one's)";
  EXPECT_LE(server_->open_connections(), limits_.max_connections);
  EXPECT_LE(server_->connection_bytes_peak(), limits_.max_connections * kRelayChargeBytes);
  // Under a sanitizer freed memory stays in quarantine and the RSS is no measure of what the
  // listener holds (the charged bytes above still are).
  if (!kUnderSanitizer) {
    EXPECT_LT(rss_during - rss_before, int64_t{4} << 20)
        << "RSS grew from " << rss_before << " to " << rss_during;
  }
  for (int i = 0; i < 5; ++i) ExpectHonestExchange(absl::StrCat("after ", i));
  for (auto& v : fds) CloseAll(&v);
}

// The relay carries TLS end to end (gRPC terminates it): mTLS peers are served during a flood,
// a plaintext peer is refused by the TLS handshake.
TEST_F(ControlLimitsTest, MutualTlsThroughTheFront) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("kvc-tls-" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  const std::string script =
      "(cd " + dir +
      " && printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' > ext"
      " && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1"
      " -subj /CN=ca -keyout ca.key -out ca.pem"
      " && openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=node "
      "-keyout node.key"
      " -out node.csr && openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key"
      " -CAcreateserial -days 1 -extfile ext -out node.pem) >/dev/null 2>&1";
  ASSERT_EQ(std::system(script.c_str()), 0) << "openssl failed in " << dir;
  TlsOptions tls;
  tls.cert = dir + "/node.pem";
  tls.key = dir + "/node.key";
  tls.ca = dir + "/ca.pem";
  tls.client_auth = true;
  Start(tls);
  ExpectHonestExchange("before");
  Flood("127.0.0.2", 10);  // idle: TLS not even begun
  Settle();
  EXPECT_EQ(CountOpen(flood_), limits_.max_connections_per_peer);
  for (int i = 0; i < 10; ++i) ExpectHonestExchange(absl::StrCat("during ", i));
  auto plaintext = MakeGrpcControlChannel(TlsOptions(), kSecret, absl::Seconds(2));
  ASSERT_TRUE(plaintext.ok());
  EXPECT_FALSE((*plaintext)(endpoint_, "plain").ok());
  std::filesystem::remove_all(dir);
}

TEST(FrontDoorTest, RefusesABudgetBelowItsConnectionCap) {
  FrontDoorOptions o;
  o.limits = {128, 32, 127 * kRelayChargeBytes};
  o.backend_path = "/nonexistent/sock";
  EXPECT_EQ(FrontDoor::Start("127.0.0.1", 0, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::kvtransfer
