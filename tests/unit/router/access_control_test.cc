#include "router/access_control.h"

#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(AccessControlTest, Sha256MatchesKnownDigest) {
  // echo -n abc | sha256sum
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(AccessControlTest, ParsesTenantsAndKeys) {
  auto set = ParseApiKeyFile(
      "# c\n tenant a requests_per_minute=2 tokens_per_minute=7 max_streams=1\ntenant b\n"
      "key " +
      Sha256Hex("k1") + " a\nkey " + Sha256Hex("k2") + " b  # the second key\n");
  ASSERT_TRUE(set.ok()) << set.status();
  ASSERT_EQ((*set)->by_digest.size(), 2u);
  const Tenant& a = *(*set)->by_digest.at(Sha256Hex("k1"));
  EXPECT_EQ(a.name, "a");
  EXPECT_EQ(a.limits.requests_per_minute, 2);
  EXPECT_EQ(a.limits.tokens_per_minute, 7);
  EXPECT_EQ(a.limits.max_streams, 1);
}

TEST(AccessControlTest, RefusesMalformedFiles) {
  const std::string h = Sha256Hex("k");
  for (const std::string& bad : std::vector<std::string>{
           "tenant\n", "tenant a rpm=3\n", "tenant a requests_per_minute=-1\n",
           "tenant a\ntenant a\n", "key " + h + " nobody\n", "tenant a\nkey abc a\n",
           "tenant a\nkey " + h + " a\nkey " + h + " a\n", "user x\n",
           "tenant a\nkey " + h + "\n"}) {
    EXPECT_FALSE(ParseApiKeyFile(bad).ok()) << bad;
  }
}

TEST(AccessControlTest, TenantNamesCannotForgeAnotherTenantsSaltPrefix) {
  // The cache salt is "tenant\x1f<name>\x1f<client salt>": a name with a separator or a
  // control character could collide with another tenant's prefix.
  for (const std::string& bad :
       std::vector<std::string>{"tenant a\x1f"
                                "b\n",
                                "tenant a\x01\n", "tenant a/b\n", "tenant \xc3\xa9\n"}) {
    EXPECT_FALSE(ParseApiKeyFile(bad).ok()) << bad;
  }
  EXPECT_TRUE(ParseApiKeyFile("tenant team-a.prod_1\n").ok());
}

TEST(AccessControlTest, ParsesScopes) {
  const std::string t = "tenant a\nkey ";
  EXPECT_FALSE(ParseApiKeyFile(t + Sha256Hex("k") + " a scopes=root\n").ok());
  EXPECT_FALSE(ParseApiKeyFile(t + Sha256Hex("k") + " a scopes=\n").ok());
  EXPECT_FALSE(ParseApiKeyFile(t + Sha256Hex("k") + " a generate\n").ok());
  auto set =
      ParseApiKeyFile(t + Sha256Hex("g") + " a\nkey " + Sha256Hex("o") + " a scopes=admin\nkey " +
                      Sha256Hex("b") + " a scopes=generate,admin\n");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ((*set)->scopes.at(Sha256Hex("g")), kScopeGenerate);
  EXPECT_EQ((*set)->scopes.at(Sha256Hex("o")), kScopeAdmin);
  EXPECT_EQ((*set)->scopes.at(Sha256Hex("b")), kScopeGenerate | kScopeAdmin);
}

class AccessControlFileTest : public testing::Test {
 protected:
  void Write(const std::string& text) { std::ofstream(path_) << text; }
  std::string path_ = testing::TempDir() + "/access_control_test_keys";
};

TEST_F(AccessControlFileTest, AuthenticatesBearerKeysAndReloads) {
  Write("tenant a\nkey " + Sha256Hex("secret") + " a\n");
  auto ac = AccessControl::Load(path_);
  ASSERT_TRUE(ac.ok()) << ac.status();
  auto t = (*ac)->AuthenticateHeader("Bearer secret");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->name, "a");
  for (const char* bad : {"", "secret", "Bearer wrong", "Basic secret", "Bearer "}) {
    auto r = (*ac)->AuthenticateHeader(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnauthenticated) << bad;
  }
  Write("tenant a\n");  // revoked
  ASSERT_TRUE((*ac)->Reload().ok());
  EXPECT_FALSE((*ac)->AuthenticateHeader("Bearer secret").ok());
  Write("garbage\n");  // a bad file keeps the previous keys
  EXPECT_FALSE((*ac)->Reload().ok());
  EXPECT_EQ((*ac)->AuthenticateHeader("Bearer secret").status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(AccessControlFileTest, ScopesDecideWhatAKeyMayDoAndReloadWithIt) {
  Write("tenant a\ntenant ops\nkey " + Sha256Hex("tenant") + " a\nkey " + Sha256Hex("op") +
        " ops scopes=admin\n");
  auto ac = AccessControl::Load(path_);
  ASSERT_TRUE(ac.ok()) << ac.status();
  EXPECT_TRUE((*ac)->AuthenticateHeader("Bearer tenant", kScopeGenerate).ok());
  EXPECT_EQ((*ac)->AuthenticateHeader("Bearer tenant", kScopeAdmin).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE((*ac)->AuthenticateHeader("Bearer op", kScopeAdmin).ok());
  EXPECT_EQ((*ac)->AuthenticateHeader("Bearer op", kScopeGenerate).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ((*ac)->AuthenticateHeader("Bearer nope", kScopeAdmin).status().code(),
            absl::StatusCode::kUnauthenticated);
  // SIGHUP's reload grants (or takes away) a scope.
  Write("tenant a\ntenant ops\nkey " + Sha256Hex("tenant") + " a scopes=generate,admin\n");
  ASSERT_TRUE((*ac)->Reload().ok());
  EXPECT_TRUE((*ac)->AuthenticateHeader("Bearer tenant", kScopeAdmin).ok());
  EXPECT_EQ((*ac)->AuthenticateHeader("Bearer op", kScopeAdmin).status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(AccessControlFileTest, LimitsPerTenant) {
  Write("tenant a requests_per_minute=2\ntenant s max_streams=1\ntenant t tokens_per_minute=10\n");
  auto ac = AccessControl::Load(path_);
  ASSERT_TRUE(ac.ok()) << ac.status();
  Tenant a{"a", {2, 0, 0}}, s{"s", {0, 0, 1}}, t{"t", {0, 10, 0}}, other{"o", {}};
  EXPECT_TRUE((*ac)->Admit(a, 1).ok());
  (*ac)->Release(a, 1);
  EXPECT_TRUE((*ac)->Admit(a, 1).ok());
  (*ac)->Release(a, 1);
  EXPECT_EQ((*ac)->Admit(a, 1).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE((*ac)->Admit(other, 1).ok());  // unlimited
  (*ac)->Release(other, 1);

  EXPECT_TRUE((*ac)->Admit(s, 1).ok());
  EXPECT_EQ((*ac)->streams("s"), 1);
  EXPECT_EQ((*ac)->Admit(s, 1).code(), absl::StatusCode::kResourceExhausted);
  (*ac)->Release(s, 0);
  EXPECT_TRUE((*ac)->Admit(s, 1).ok());
  (*ac)->Release(s, 0);

  EXPECT_TRUE((*ac)->Admit(t, 4).ok());
  (*ac)->Release(t, 5);  // 9 of 10
  EXPECT_TRUE((*ac)->Admit(t, 1).ok());
  (*ac)->Release(t, 0);  // 10 of 10
  EXPECT_EQ((*ac)->Admit(t, 1).code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace tandem
