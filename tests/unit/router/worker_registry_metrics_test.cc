// WorkerRegistry reports each worker's health to RouterHooks (read back from RouterMetrics):
// 0 at registration, 1 once its stats stream is up, 0 when the stream breaks or a call fails.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/metrics/metric_reader.h"
#include "common/metrics/router_metrics.h"
#include "router/worker_registry.h"
#include "tests/unit/router/fake_registry_worker.h"

namespace tandem {
namespace {

using Server = FakeRegistryWorkerServer;

TEST(WorkerRegistryMetricsTest, HealthFollowsTheStatsStream) {
  prometheus::Registry metrics_registry;
  RouterMetrics metrics(&metrics_registry);
  Server a, b;
  RegistryOptions o;
  o.decode_addresses = {a.address, b.address};
  o.resolve_interval = absl::Milliseconds(50);
  o.hooks = &metrics;
  WorkerRegistry registry(o);
  registry.Start();
  ASSERT_TRUE(registry.WaitForWorkers(0, 2, absl::Seconds(10)));
  auto healthy = [&](const std::string& worker) {
    return ReadMetric(metrics_registry, "tandem_router_worker_healthy",
                      {{"worker", worker}, {"role", "decode"}});
  };
  EXPECT_TRUE(Eventually([&] { return healthy(a.address) == 1 && healthy(b.address) == 1; }));
  EXPECT_EQ(ReadMetric(metrics_registry, "tandem_router_worker_healthy"), 2);

  a.Stop();  // the stream breaks: unhealthy, and stays so while it cannot re-register
  EXPECT_TRUE(Eventually([&] { return healthy(a.address) == 0; }));
  EXPECT_EQ(healthy(b.address), 1);

  const std::shared_ptr<Worker> failed = registry.Healthy("decode").front();
  registry.ReportFailure(failed);  // a call to b failed
  EXPECT_FALSE(failed->healthy.load());
  // Its metric reads 0 until discovery, woken by the cancelled stream, re-registers b (a new
  // Worker); on a loaded machine that may already have happened.
  const std::optional<double> after_failure = healthy(b.address);
  const bool replaced = [&] {  // read after the metric
    for (const auto& w : registry.All()) {
      if (w->address == b.address) return w != failed;
    }
    return false;
  }();
  EXPECT_TRUE(after_failure == 0.0 || replaced) << after_failure.value_or(-1);
  // Discovery re-registers b (its server is up): healthy again.
  EXPECT_TRUE(Eventually([&] { return healthy(b.address) == 1; }));
  EXPECT_EQ(healthy(a.address), 0);
  registry.Stop();
  b.Stop();
}

}  // namespace
}  // namespace tandem
