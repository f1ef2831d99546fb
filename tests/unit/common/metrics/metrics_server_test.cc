#include "common/metrics/metrics_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/metrics/engine_metrics.h"
#include "common/metrics/metric_reader.h"
#include "common/metrics/process_metrics.h"

namespace tandem {
namespace {

// GET http://127.0.0.1:port/path; returns the whole response (status line, headers, body), or
// what arrived within `timeout_s` of each read.
std::string HttpGet(int port, const std::string& path, int timeout_s = 30) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return "";
  }
  timeval tv{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  const std::string request =
      "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  (void)!write(fd, request.data(), request.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) out.append(buf, n);
  close(fd);
  return out;
}

TEST(MetricsServerTest, ServesTheRegistryOnItsOwnPort) {
  auto registry = std::make_shared<prometheus::Registry>();
  EngineMetrics engine(registry.get(), "both");
  RegisterProcessInfo(registry.get(), "serve");
  EngineCounters c;
  c.kv_blocks_total = 64;
  engine.Update(c);
  auto server = MetricsServer::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);
  const std::string response = HttpGet((*server)->port(), "/metrics");
  EXPECT_NE(response.find("200 OK"), std::string::npos) << response;
  EXPECT_NE(response.find("# TYPE tandem_engine_kv_blocks_capacity gauge"), std::string::npos);
  EXPECT_NE(response.find("tandem_engine_kv_blocks_capacity{role=\"both\"} 64"), std::string::npos);
  EXPECT_NE(response.find("tandem_build_info{component=\"serve\",version=\""), std::string::npos)
      << response;
  EXPECT_NE(HttpGet((*server)->port(), "/nope").find("404"), std::string::npos);
}

// The HTTP server's protections hold on /metrics: clients that never finish their headers hold
// no thread (a scrape is served while they wait), and oversized headers get a 431.
TEST(MetricsServerTest, StalledClientsDoNotBlockAScrape) {
  auto registry = std::make_shared<prometheus::Registry>();
  RegisterProcessInfo(registry.get(), "decode");
  auto server = MetricsServer::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<int> stalled;
  for (int i = 0; i < 8; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    const std::string partial = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
    (void)!write(fd, partial.data(), partial.size());
    stalled.push_back(fd);
  }
  const auto start = std::chrono::steady_clock::now();
  const std::string response = HttpGet(port, "/metrics", /*timeout_s=*/4);
  EXPECT_NE(response.find("200 OK"), std::string::npos) << response;
  EXPECT_NE(response.find("tandem_build_info"), std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
  const std::string huge = "/metrics?" + std::string(20000, 'a');
  EXPECT_NE(HttpGet(port, huge).find("431"), std::string::npos);
  for (int fd : stalled) close(fd);
}

TEST(MetricsServerTest, PortInUseIsAnError) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto first = MetricsServer::Start("127.0.0.1", 0, registry);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = MetricsServer::Start("127.0.0.1", (*first)->port(), registry);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(std::to_string((*first)->port())), std::string::npos);
}

TEST(MetricsServerTest, ProcessInfo) {
  prometheus::Registry registry;
  RegisterProcessInfo(&registry, "router");
  EXPECT_EQ(ReadMetric(registry, "tandem_build_info", {{"component", "router"}}), 1);
  EXPECT_GT(ReadMetric(registry, "tandem_process_start_time_seconds").value_or(0), 1.6e9);
}

TEST(ProcessMetricsTest, FlagsPortFileAndOff) {
  MetricsOptions options;
  FlagSet flags("test", "");
  RegisterMetricsFlags(&flags, &options);
  const std::string port_file =
      (std::filesystem::temp_directory_path() / ("metrics-port-" + std::to_string(getpid())))
          .string();
  const std::string file_flag = "--metrics-port-file=" + port_file;
  const char* argv[] = {"test", "--metrics-port=-1", file_flag.c_str()};
  ASSERT_TRUE(flags.Parse(3, const_cast<char**>(argv)).ok());
  auto m = ProcessMetrics::Start(options, "decode", "127.0.0.1");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_GT((*m)->port(), 0);
  int written = 0;
  std::ifstream(port_file) >> written;
  EXPECT_EQ(written, (*m)->port());
  std::filesystem::remove(port_file);
  EXPECT_EQ(ReadMetric(*(*m)->registry(), "tandem_build_info", {{"component", "decode"}}), 1);
  EXPECT_NE(HttpGet((*m)->port(), "/metrics").find("tandem_build_info"), std::string::npos);

  auto off = ProcessMetrics::Start(MetricsOptions{}, "router", "127.0.0.1");
  ASSERT_TRUE(off.ok());
  EXPECT_EQ((*off)->port(), 0);  // collected, not served
  EXPECT_EQ(ReadMetric(*(*off)->registry(), "tandem_build_info"), 1);

  MetricsOptions bad;
  bad.port = 70000;
  EXPECT_EQ(ProcessMetrics::Start(bad, "router", "127.0.0.1").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
