// /metrics over TLS and mTLS (MetricsServer with HttpTlsOptions), with certificates made here
// by the `openssl` command.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/metrics/metrics_server.h"
#include "common/metrics/process_metrics.h"

namespace tandem {
namespace {

// Plaintext GET http://127.0.0.1:port/metrics; the whole response ("" when refused).
std::string PlainGet(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return "";
  }
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string request =
      "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  (void)!write(fd, request.data(), request.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, n);
  close(fd);
  return out;
}

class MetricsTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (std::filesystem::temp_directory_path() / ("metrics-tls-" + std::to_string(getpid())))
               .string();
    std::filesystem::create_directories(dir_);
    const std::string script =
        "(cd " + dir_ +
        " && printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' "
        "> ext"
        " && for ca in ca rogue_ca; do openssl req -x509 -newkey rsa:2048 -nodes -days 1 "
        "-subj /CN=$ca -keyout $ca.key -out $ca.pem || exit 1; done"
        " && for n in node:ca rogue:rogue_ca; do name=${n%%:*}; ca=${n##*:};"
        " openssl req -newkey rsa:2048 -nodes -subj /CN=$name -keyout $name.key -out $name.csr"
        " && openssl x509 -req -in $name.csr -CA $ca.pem -CAkey $ca.key -CAcreateserial -days 1"
        " -extfile ext -out $name.pem || exit 1; done) >/dev/null 2>&1";
    ASSERT_EQ(std::system(script.c_str()), 0) << "openssl failed in " << dir_;
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  static std::string P(const std::string& name) { return dir_ + "/" + name; }

  std::unique_ptr<MetricsServer> Start(const HttpTlsOptions& tls) {
    registry_ = std::make_shared<prometheus::Registry>();
    RegisterProcessInfo(registry_.get(), "decode");
    auto server = MetricsServer::Start("127.0.0.1", 0, registry_, tls);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? std::move(*server) : nullptr;
  }
  // GET https://127.0.0.1:port/metrics verifying the server against `ca`, presenting `cert`
  // (none when empty). The body when the status is 200, else "".
  static std::string TlsGet(int port, const std::string& ca, const std::string& cert = "") {
    std::unique_ptr<httplib::SSLClient> client =
        cert.empty() ? std::make_unique<httplib::SSLClient>("127.0.0.1", port)
                     : std::make_unique<httplib::SSLClient>("127.0.0.1", port, P(cert + ".pem"),
                                                            P(cert + ".key"));
    client->set_ca_cert_path(P(ca + ".pem").c_str());
    client->enable_server_certificate_verification(true);
    client->set_connection_timeout(5, 0);
    client->set_read_timeout(5, 0);
    auto res = client->Get("/metrics");
    return res && res->status == 200 ? res->body : "";
  }

  static std::string dir_;
  std::shared_ptr<prometheus::Registry> registry_;
};
std::string MetricsTlsTest::dir_;

TEST_F(MetricsTlsTest, TlsOnlyWithACertificate) {
  auto server = Start({P("node.pem"), P("node.key"), ""});
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  const std::string body = TlsGet(port, "ca");
  EXPECT_NE(body.find("tandem_build_info{component=\"decode\""), std::string::npos) << body;
  EXPECT_EQ(PlainGet(port).find("200 OK"), std::string::npos);  // plaintext is refused
  EXPECT_EQ(TlsGet(port, "rogue_ca"), "");  // a client that does not trust it fails too
  EXPECT_NE(TlsGet(port, "ca").find("tandem_build_info"), std::string::npos);  // still serving
}

TEST_F(MetricsTlsTest, MutualTlsRequiresAClientCertificateOfTheCa) {
  auto server = Start({P("node.pem"), P("node.key"), P("ca.pem")});
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  EXPECT_NE(TlsGet(port, "ca", "node").find("tandem_build_info"), std::string::npos);
  EXPECT_EQ(TlsGet(port, "ca"), "");           // no client certificate
  EXPECT_EQ(TlsGet(port, "ca", "rogue"), "");  // another CA's
  EXPECT_EQ(PlainGet(port).find("200 OK"), std::string::npos);
  EXPECT_NE(TlsGet(port, "ca", "node").find("tandem_build_info"), std::string::npos);
}

TEST_F(MetricsTlsTest, BadTlsFilesAreInvalidArgument) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto missing = MetricsServer::Start("127.0.0.1", 0, registry, {P("nope.pem"), P("nope.key"), ""});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument) << missing.status();
  EXPECT_NE(missing.status().message().find("metrics: cannot load"), std::string::npos)
      << missing.status();
  auto no_cert = MetricsServer::Start("127.0.0.1", 0, registry, {"", "", P("ca.pem")});
  EXPECT_EQ(no_cert.status().code(), absl::StatusCode::kInvalidArgument) << no_cert.status();
  MetricsOptions options;
  options.port = -1;
  options.tls = {P("node.pem"), P("ca.key"), ""};  // a key that is not the certificate's
  EXPECT_EQ(ProcessMetrics::Start(options, "router", "127.0.0.1").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
