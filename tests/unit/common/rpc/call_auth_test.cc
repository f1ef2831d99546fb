#include "common/rpc/call_auth.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "common/rpc/server.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem {
namespace {

constexpr char kSecret[] = "0123456789abcdef0123456789abcdef";
constexpr char kDecode[] = "/tandem.v1.Worker/Decode";
constexpr char kStats[] = "/tandem.v1.Worker/GetStats";

TEST(InternalTokenTest, AcceptsItsOwnMethodWithinTheWindow) {
  const absl::Time now = absl::Now();
  const std::string token = MintInternalToken(kSecret, kDecode, now);
  EXPECT_TRUE(VerifyInternalToken(kSecret, kDecode, token, now, absl::Seconds(60)).ok());
  EXPECT_TRUE(
      VerifyInternalToken(kSecret, kDecode, token, now + absl::Seconds(59), absl::Seconds(60))
          .ok());
  // Two tokens for the same call differ (fresh nonce).
  EXPECT_NE(token, MintInternalToken(kSecret, kDecode, now));
}

TEST(InternalTokenTest, RefusesAnotherMethodAnotherSecretAndForgeries) {
  const absl::Time now = absl::Now();
  const std::string token = MintInternalToken(kSecret, kDecode, now);
  EXPECT_EQ(VerifyInternalToken(kSecret, kStats, token, now, absl::Seconds(60)).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(VerifyInternalToken("another secret of 32 bytes......", kDecode, token, now,
                                absl::Seconds(60))
                .code(),
            absl::StatusCode::kUnauthenticated);
  std::string flipped = token;
  flipped.back() = flipped.back() == '0' ? '1' : '0';
  EXPECT_FALSE(VerifyInternalToken(kSecret, kDecode, flipped, now, absl::Seconds(60)).ok());
  // A later timestamp with the old MAC: the MAC covers the time.
  std::string moved = token;
  moved[3] = moved[3] == '9' ? '8' : '9';
  EXPECT_FALSE(VerifyInternalToken(kSecret, kDecode, moved, now, absl::Seconds(60)).ok());
  for (const char* bad : {"", "v1", "v1...", "v2.1.2.3", "garbage"}) {
    EXPECT_FALSE(VerifyInternalToken(kSecret, kDecode, bad, now, absl::Seconds(60)).ok()) << bad;
  }
}

TEST(InternalTokenTest, RefusesATokenOutsideTheWindow) {
  const absl::Time minted = absl::Now();
  const std::string token = MintInternalToken(kSecret, kDecode, minted);
  absl::Status late =
      VerifyInternalToken(kSecret, kDecode, token, minted + absl::Seconds(61), absl::Seconds(60));
  EXPECT_EQ(late.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(late.message().find("window"), std::string::npos) << late;
  EXPECT_FALSE(
      VerifyInternalToken(kSecret, kDecode, token, minted - absl::Seconds(61), absl::Seconds(60))
          .ok());
}

TEST(InternalTokenTest, ATokenPassesOnce) {
  CallCheck check = RequireInternalToken(kSecret);
  const std::string token = MintInternalToken(kSecret, kDecode, absl::Now());
  CallMetadata md = {{kInternalTokenKey, token}};
  EXPECT_TRUE(check(kDecode, md).ok());
  grpc::Status again = check(kDecode, md);
  EXPECT_EQ(again.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(again.error_message().find("replay"), std::string::npos) << again.error_message();
  // A fresh token for the same call passes.
  const std::string another = MintInternalToken(kSecret, kDecode, absl::Now());
  CallMetadata fresh = {{kInternalTokenKey, another}};
  EXPECT_TRUE(check(kDecode, fresh).ok());
}

TEST(TokenReplayCacheTest, ForgetsPastTwiceTheWindowAndAboveTheCap) {
  const absl::Time t0 = absl::Now();
  TokenReplayCache cache(absl::Seconds(60), 2);
  EXPECT_TRUE(cache.FirstUse("a", t0));
  EXPECT_FALSE(cache.FirstUse("a", t0 + absl::Seconds(119)));
  EXPECT_TRUE(cache.FirstUse("a", t0 + absl::Seconds(121)));  // the time check refuses it anyway
  EXPECT_TRUE(cache.FirstUse("b", t0 + absl::Seconds(121)));
  EXPECT_TRUE(cache.FirstUse("c", t0 + absl::Seconds(121)));
  EXPECT_TRUE(cache.FirstUse("d", t0 + absl::Seconds(121)));  // "a" fell off the cap
  EXPECT_TRUE(cache.FirstUse("a", t0 + absl::Seconds(121)));
}

TEST(CallPolicyTest, HealthAndReflectionOpenNamedServicesByRuleTheRestDenied) {
  CallPolicy policy;
  policy.services["tandem.v1.Generation"] = nullptr;
  CallMetadata none;
  EXPECT_TRUE(policy.Check("/grpc.health.v1.Health/Check", none).ok());
  EXPECT_TRUE(
      policy.Check("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", none).ok());
  EXPECT_TRUE(policy.Check("/tandem.v1.Generation/Generate", none).ok());
  EXPECT_EQ(policy.Check("/tandem.v1.Worker/Decode", none).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // A method nobody listed is covered by its service's rule.
  policy.fallback = RequireInternalToken(kSecret);
  EXPECT_EQ(policy.Check("/tandem.v1.Worker/SomeNewMethod", none).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  const std::string token =
      MintInternalToken(kSecret, "/tandem.v1.Worker/SomeNewMethod", absl::Now());
  CallMetadata with = {{kInternalTokenKey, token}};
  EXPECT_TRUE(policy.Check("/tandem.v1.Worker/SomeNewMethod", with).ok());
  EXPECT_FALSE(policy.Check("/tandem.v1.Worker/Decode", with).ok());
}

// A real plaintext listener: the policy runs before any handler, on every method.
class ListenerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto policy = std::make_shared<CallPolicy>();
    policy->fallback = RequireInternalToken(kSecret);
    ServerOptions options;
    auto running = StartGrpcServer(options, {&service_}, policy);
    ASSERT_TRUE(running.ok()) << running.status();
    server_ = std::move(running).value();
    address_ = absl::StrCat("127.0.0.1:", server_.port);
  }
  void TearDown() override { server_.server->Shutdown(); }

  grpc::Status GetStats(const std::shared_ptr<grpc::Channel>& channel,
                        const std::string& token = "") {
    auto stub = v1::Worker::NewStub(channel);
    grpc::ClientContext context;
    if (!token.empty()) context.AddMetadata(kInternalTokenKey, token);
    v1::WorkerStats out;
    return stub->GetStats(&context, v1::StatsRequest(), &out);
  }

  v1::Worker::CallbackService service_;  // every method UNIMPLEMENTED once let through
  RunningServer server_;
  std::string address_;
};

TEST_F(ListenerTest, RefusesCallsWithoutAValidTokenBeforeTheHandler) {
  auto plain = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  grpc::Status st = GetStats(plain);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  st = GetStats(plain, MintInternalToken(kSecret, kDecode, absl::Now()));  // another method's
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  st = GetStats(plain, MintInternalToken(kSecret, kStats, absl::Now() - absl::Minutes(5)));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  st = GetStats(plain, MintInternalToken("not the secret, but 32 bytes....", kStats, absl::Now()));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
}

TEST_F(ListenerTest, TheInterceptorsTokenPasses) {
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> i;
  i.push_back(InternalTokenInterceptor(kSecret));
  auto channel = grpc::experimental::CreateCustomChannelWithInterceptors(
      address_, grpc::InsecureChannelCredentials(), grpc::ChannelArguments(), std::move(i));
  // Past the policy, the handler answers UNIMPLEMENTED.
  EXPECT_EQ(GetStats(channel).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> wrong;
  wrong.push_back(InternalTokenInterceptor("not the secret, but 32 bytes...."));
  auto impostor = grpc::experimental::CreateCustomChannelWithInterceptors(
      address_, grpc::InsecureChannelCredentials(), grpc::ChannelArguments(), std::move(wrong));
  EXPECT_EQ(GetStats(impostor).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

}  // namespace
}  // namespace tandem
