#include "kvtransfer/faults.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace tandem::kvtransfer {
namespace {

TEST(FaultsTest, ParsesTheDocumentedSpec) {
  auto o = ParseFaultOptions("kv_corrupt=0.01,kv_drop=0.02,kv_delay_ms=50,seed=1");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_DOUBLE_EQ(o->kv_corrupt, 0.01);
  EXPECT_DOUBLE_EQ(o->kv_drop, 0.02);
  EXPECT_EQ(o->kv_delay_ms, 50);
  EXPECT_DOUBLE_EQ(o->kv_delay, 1.0);  // implied by kv_delay_ms alone
  EXPECT_EQ(o->seed, 1u);
  EXPECT_TRUE(o->enabled());
  auto p = ParseFaultOptions(" kv_close = 0.5 , kv_delay=0.25, kv_delay_ms=5, max_faults=3 ");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->kv_close, 0.5);
  EXPECT_DOUBLE_EQ(p->kv_delay, 0.25);
  EXPECT_EQ(p->max_faults, 3);
  EXPECT_FALSE(ParseFaultOptions("")->enabled());
}

TEST(FaultsTest, RejectsMalformedSpecs) {
  EXPECT_FALSE(ParseFaultOptions("kv_corrupt=2").ok());
  EXPECT_FALSE(ParseFaultOptions("kv_corrupt").ok());
  EXPECT_FALSE(ParseFaultOptions("kv_bogus=1").ok());
  EXPECT_FALSE(ParseFaultOptions("kv_delay_ms=-1").ok());
  EXPECT_FALSE(ParseFaultOptions("seed=x").ok());
}

TEST(FaultsTest, EnvironmentEnablesWhenOptionsDoNot) {
  setenv("TANDEM_FAULTS", "kv_drop=0.5,seed=9", 1);
  FaultOptions none;
  EXPECT_DOUBLE_EQ(ResolveFaultOptions(none, true).kv_drop, 0.5);
  EXPECT_FALSE(ResolveFaultOptions(none, false).enabled());
  FaultOptions explicit_options;
  explicit_options.kv_corrupt = 0.1;
  EXPECT_DOUBLE_EQ(ResolveFaultOptions(explicit_options, true).kv_drop, 0);
  setenv("TANDEM_FAULTS", "garbage", 1);
  EXPECT_FALSE(ResolveFaultOptions(none, true).enabled());
  unsetenv("TANDEM_FAULTS");
  EXPECT_FALSE(ResolveFaultOptions(none, true).enabled());
}

TEST(FaultsTest, SeededDecisionsAreReproducibleAndBounded) {
  FaultOptions o;
  o.kv_corrupt = 0.3;
  o.kv_drop = 0.2;
  o.seed = 42;
  FaultInjector a(o), b(o);
  int corrupt = 0, drop = 0;
  for (int i = 0; i < 2000; ++i) {
    auto x = a.Next(), y = b.Next();
    ASSERT_EQ(x.corrupt, y.corrupt);
    ASSERT_EQ(x.drop, y.drop);
    ASSERT_FALSE(x.corrupt && x.drop);
    corrupt += x.corrupt;
    drop += x.drop;
  }
  EXPECT_NEAR(drop / 2000.0, 0.2, 0.05);
  EXPECT_NEAR(corrupt / 2000.0, 0.8 * 0.3, 0.05);
  o.max_faults = 2;
  o.kv_drop = 1;
  FaultInjector capped(o);
  EXPECT_TRUE(capped.Next().any());
  EXPECT_TRUE(capped.Next().any());
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(capped.Next().any());
  EXPECT_EQ(capped.injected(), 2u);
  FaultInjector off(FaultOptions{});
  EXPECT_FALSE(off.enabled());
  EXPECT_FALSE(off.Next().any());
}

}  // namespace
}  // namespace tandem::kvtransfer
