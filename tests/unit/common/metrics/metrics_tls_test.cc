// /metrics over TLS and mTLS (MetricsServer with HttpTlsOptions), with certificates made here
// by the `openssl` command.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/metrics/metrics_server.h"
#include "common/metrics/process_metrics.h"

namespace tandem {
namespace {

// A TCP connection to 127.0.0.1:port with a 5 s receive timeout; -1 when refused.
int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

const char kRequest[] = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";

// Plaintext GET http://127.0.0.1:port/metrics; the whole response ("" when refused).
std::string PlainGet(int port) {
  const int fd = Connect(port);
  if (fd < 0) return "";
  (void)!write(fd, kRequest, sizeof kRequest - 1);
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
  // GET https://127.0.0.1:port/metrics with OpenSSL, verifying the server's certificate (for
  // IP 127.0.0.1) against `ca`, presenting `cert` (none when empty). The body when the status is
  // 200, else "".
  static std::string TlsGet(int port, const std::string& ca, const std::string& cert = "") {
    SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
    std::string response;
    const bool configured =
        SSL_CTX_load_verify_locations(ctx, P(ca + ".pem").c_str(), nullptr) == 1 &&
        (cert.empty() ||
         (SSL_CTX_use_certificate_chain_file(ctx, P(cert + ".pem").c_str()) == 1 &&
          SSL_CTX_use_PrivateKey_file(ctx, P(cert + ".key").c_str(), SSL_FILETYPE_PEM) == 1));
    EXPECT_TRUE(configured) << "client files " << ca << " " << cert;
    const int fd = configured ? Connect(port) : -1;
    if (fd >= 0) {
      SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
      SSL* ssl = SSL_new(ctx);
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), "127.0.0.1");
      SSL_set_fd(ssl, fd);
      if (SSL_connect(ssl) == 1 && SSL_write(ssl, kRequest, sizeof kRequest - 1) > 0) {
        char buf[4096];
        int n;
        while ((n = SSL_read(ssl, buf, sizeof buf)) > 0) response.append(buf, n);
      }
      SSL_free(ssl);
      close(fd);
    }
    SSL_CTX_free(ctx);
    if (response.rfind("HTTP/1.1 200 ", 0) != 0) return "";
    const size_t body = response.find("\r\n\r\n");
    return body == std::string::npos ? "" : response.substr(body + 4);
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
