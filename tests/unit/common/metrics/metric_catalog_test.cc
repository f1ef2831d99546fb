// The catalog of every metric family: all components' families registered in one registry
// (names are unique across components and follow Prometheus conventions), every family is
// documented in docs/operations.md, and every `tandem_*` series that a dashboard, a recording
// rule or an alert names exists.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "common/metrics/engine_metrics.h"
#include "common/metrics/kv_tier_metrics.h"
#include "common/metrics/metrics_server.h"
#include "common/metrics/router_metrics.h"
#include "common/metrics/spec_metrics.h"
#include "common/metrics/transfer_metrics.h"
#include "common/metrics/worker_metrics.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::vector<prometheus::MetricFamily> AllFamilies() {
  static prometheus::Registry registry;
  static EngineMetrics engine(&registry, "both");
  static RouterMetrics router(&registry);
  static WorkerMetrics worker(&registry, "both");
  static TransferMetrics transfer(&registry, "tcp");
  static SpecMetrics spec(&registry, "ngram");
  static KvTierMetrics tiers(&registry, "both");
  static bool once = [] {
    RegisterProcessInfo(&registry, "test");
    router.RecordRoutingDecision("round_robin", routing_reason::kRoundRobin);
    router.SetWorkerHealthy("w", "decode", true);
    EngineCounters lora;  // LoRA series exist once LoRA is on and an adapter was used
    lora.lora_adapters_loaded = 1;
    engine.Update(lora);
    FinishedSequence finished;
    finished.finish_reason = "stop";
    finished.lora_adapter = "adapter";
    engine.OnSequenceFinished(finished);
    return true;
  }();
  (void)once;
  return registry.Collect();
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

TEST(MetricCatalogTest, NamesFollowPrometheusConventions) {
  const std::regex valid("tandem_[a-z0-9_]+");
  for (const auto& f : AllFamilies()) {
    SCOPED_TRACE(f.name);
    EXPECT_TRUE(std::regex_match(f.name, valid));
    EXPECT_FALSE(f.help.empty());
    if (f.type == prometheus::MetricType::Counter) {
      EXPECT_TRUE(EndsWith(f.name, "_total"));
    } else {
      EXPECT_FALSE(EndsWith(f.name, "_total"));
    }
    // Base units only.
    for (const char* bad : {"_ms", "_milliseconds", "_microseconds", "_kb", "_mb", "_percent"}) {
      EXPECT_EQ(f.name.find(bad), std::string::npos);
    }
    if (f.type == prometheus::MetricType::Histogram && f.name.find("time") != std::string::npos) {
      EXPECT_TRUE(EndsWith(f.name, "_seconds"));
    }
    for (const auto& m : f.metric) {
      for (const auto& l : m.label) {
        // Bounded labels only: never a request id.
        EXPECT_NE(l.name, "request_id");
        EXPECT_NE(l.name, "id");
      }
    }
  }
}

// Series names a query can use: counters and gauges by name; histograms as _bucket/_sum/_count.
std::set<std::string> SeriesNames() {
  std::set<std::string> names;
  for (const auto& f : AllFamilies()) {
    if (f.type == prometheus::MetricType::Histogram) {
      for (const char* s : {"_bucket", "_sum", "_count"}) names.insert(f.name + s);
    } else {
      names.insert(f.name);
    }
  }
  return names;
}

TEST(MetricCatalogTest, EveryFamilyIsDocumented) {
  const std::string doc = ReadFile(fs::path(tandem::TestSourceDir()) / "docs" / "operations.md");
  ASSERT_FALSE(doc.empty());
  for (const auto& f : AllFamilies()) {
    EXPECT_NE(doc.find("`" + f.name + "`"), std::string::npos)
        << f.name << " is not in docs/operations.md's metrics list";
  }
}

TEST(MetricCatalogTest, DashboardsRulesAndDocsNameOnlyExistingSeries) {
  const std::set<std::string> series = SeriesNames();
  std::set<std::string> families;
  for (const auto& f : AllFamilies()) families.insert(f.name);
  // tandem_ identifiers, except inside recording-rule names (level:tandem_...:operation).
  const std::regex ref("\\btandem_[a-z0-9_]+\\b");
  std::vector<fs::path> files = {fs::path(tandem::TestSourceDir()) / "docs" / "operations.md"};
  for (const char* dir : {"deploy/grafana", "deploy/prometheus", "deploy/helm/tandem"}) {
    const fs::path root = fs::path(tandem::TestSourceDir()) / dir;
    ASSERT_TRUE(fs::exists(root)) << root;
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      const std::string ext = e.path().extension().string();
      if (e.is_regular_file() && (ext == ".json" || ext == ".yaml" || ext == ".yml")) {
        files.push_back(e.path());
      }
    }
  }
  int refs = 0;
  for (const fs::path& file : files) {
    const std::string text = ReadFile(file);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), ref);
         it != std::sregex_iterator(); ++it) {
      const std::string name = it->str();
      const size_t begin = it->position(), end = begin + name.size();
      if ((begin > 0 && text[begin - 1] == ':') || (end < text.size() && text[end] == ':')) {
        continue;
      }
      ++refs;
      // Prose may name a histogram family; queries must name its _bucket/_sum/_count.
      const bool ok =
          series.count(name) != 0 || (file.extension() == ".md" && families.count(name) != 0);
      EXPECT_TRUE(ok) << file << " names unknown series " << name;
    }
  }
  EXPECT_GT(refs, 50);
}

}  // namespace
}  // namespace tandem
