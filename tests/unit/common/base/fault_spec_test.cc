#include "common/base/fault_spec.h"

#include <gtest/gtest.h>

#include <string>

namespace tandem {
namespace {

struct Parsed {
  uint64_t seed = 0;
  int64_t max_faults = 0;
  double prob = 0;
  int64_t ms = 0;
  absl::Status status;
};

Parsed ParseWith(absl::string_view spec) {
  Parsed p;
  p.status = FaultSpecParser(&p.seed, &p.max_faults)
                 .Probability("a_prob", &p.prob)
                 .Count("a_ms", &p.ms)
                 .Skip("other_key")
                 .Parse(spec);
  return p;
}

TEST(FaultSpecParserTest, ReadsItsKeysAndSkipsOtherComponents) {
  const Parsed p = ParseWith(" a_prob=0.25, a_ms = 40,other_key=whatever,seed=7,max_faults=3 ");
  ASSERT_TRUE(p.status.ok()) << p.status;
  EXPECT_EQ(p.prob, 0.25);
  EXPECT_EQ(p.ms, 40);
  EXPECT_EQ(p.seed, 7u);
  EXPECT_EQ(p.max_faults, 3);
  EXPECT_TRUE(ParseWith("").status.ok());
}

TEST(FaultSpecParserTest, RefusesBadItemsNamingThem) {
  for (const auto& [spec, needle] : std::initializer_list<std::pair<const char*, const char*>>{
           {"a_prob", "'a_prob' is not key=value"},
           {"a_prob=1.5", "a_prob: '1.5' is not a probability in [0, 1]"},
           {"a_prob=nan", "not a probability"},
           {"a_ms=-1", "a_ms: bad value '-1'"},
           {"max_faults=x", "max_faults: bad value 'x'"},
           {"seed=-3", "seed: bad value '-3'"},
           {"typo=1",
            "unknown fault option 'typo' (known: seed, max_faults, a_prob, a_ms, "
            "other_key)"}}) {
    const Parsed p = ParseWith(spec);
    EXPECT_EQ(p.status.code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_NE(std::string(p.status.message()).find(needle), std::string::npos)
        << spec << ": " << p.status.message();
  }
}

}  // namespace
}  // namespace tandem
