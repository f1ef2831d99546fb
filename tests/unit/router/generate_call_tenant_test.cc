// Request ids and tenants at the Generation service: a client-chosen request id is
// scoped by tenant (another tenant's same id is neither refused, nor seen, nor cancelled), the
// workers know every call by a random id of its own, server-made ids are unpredictable, and a
// tenant past its limits is refused before its body is parsed or tokenized.

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>

#include "router/access_control.h"
#include "tests/unit/router/generate_call_fixture.h"

namespace tandem {
namespace testing_generate_call {
namespace {

bool IsRandomId(const std::string& id) {
  if (id.rfind("req-", 0) != 0 || id.size() != 4 + 32) return false;
  for (char c : id.substr(4)) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

class GenerateCallTenantTest : public GenerateCallTest {
 protected:
  void SetUp() override {
    GenerateCallTest::SetUp();
    path_ = ::testing::TempDir() + "/keys_" + std::to_string(getpid());
    std::ofstream(path_) << "tenant a\ntenant b\ntenant one max_streams=1\n"
                         << "key " << Sha256Hex("ka") << " a\n"
                         << "key " << Sha256Hex("kb") << " b\n"
                         << "key " << Sha256Hex("k1") << " one\n";
    auto access = AccessControl::Load(path_);
    ASSERT_TRUE(access.ok()) << access.status();
    access_ = std::move(access).value();
    service_->set_access_control(access_.get());
  }
  void TearDown() override {
    GenerateCallTest::TearDown();
    std::remove(path_.c_str());
  }
  std::unique_ptr<Call> StartAs(const std::string& key, const v1::GenerateRequest& request) {
    auto call = std::make_unique<Call>();
    call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    call->context.AddMetadata("authorization", "Bearer " + key);
    call->reader = stub_->Generate(&call->context, request);
    return call;
  }

  std::string path_;
  std::unique_ptr<AccessControl> access_;
};

TEST_F(GenerateCallTenantTest, ClientIdsAreScopedByTenant) {
  auto a = StartAs("ka", TextRequest("Hi"));  // request id "r1"
  const std::string a_worker = client_.WaitForRequest().request_id();
  // Tenant b uses the same id: admitted (nothing tells it that a's exists), under another
  // worker-side id.
  auto b = StartAs("kb", TextRequest("Hi"));
  ASSERT_TRUE(client_.WaitForRequests(2));
  const std::string b_worker = client_.WaitForRequest().request_id();
  EXPECT_NE(a_worker, b_worker);
  EXPECT_TRUE(IsRandomId(a_worker) && IsRandomId(b_worker)) << a_worker << " " << b_worker;
  // Within a tenant the id stays unique: a's second "r1" is refused and reaches no worker.
  const Received again = StartAs("ka", TextRequest("Hi"))->Finish();
  EXPECT_EQ(again.status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(client_.requests(), 2u);

  // a cancels its "r1": only a's worker request is cancelled; b's runs on and completes.
  a->context.TryCancel();
  EXPECT_TRUE(client_.WaitForCancel(a_worker, -1));
  EXPECT_EQ(a->Finish().status.error_code(), grpc::StatusCode::CANCELLED);
  client_.Tokens(0, Ids(" there"));  // to b: the last request's callback
  client_.Final(0, v1::FINISH_REASON_LENGTH, 1);
  const Received got = b->Finish();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.Text(0), " there");
  for (const auto& r : got.responses) EXPECT_EQ(r.request_id(), "r1") << "b sees its own id";
  for (const auto& [id, index] : client_.cancels()) {
    EXPECT_NE(id, b_worker) << "tenant a cancelled tenant b's request";
  }
  // Once a's "r1" ended, a may use it again. The server frees the id when it is done with the
  // call, which may be just after a's client saw CANCELLED: until then ALREADY_EXISTS.
  std::unique_ptr<Call> a2;
  for (int tries = 0; tries < 50; ++tries) {
    a2 = StartAs("ka", TextRequest("Hi"));
    // A refusal comes at once; an admitted call reaches the worker well within 2 s.
    if (client_.WaitForRequests(3, std::chrono::seconds(2))) break;
    EXPECT_EQ(a2->Finish().status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
    a2.reset();
  }
  ASSERT_NE(a2, nullptr) << "a's id was never freed";
  client_.Final(0, v1::FINISH_REASON_LENGTH, 0);
  EXPECT_TRUE(a2->Finish().status.ok());
}

TEST_F(GenerateCallTenantTest, ServerMadeIdsAreRandom) {
  std::set<std::string> seen;
  for (int i = 0; i < 4; ++i) {
    v1::GenerateRequest request = TextRequest("Hi");
    request.clear_request_id();
    auto call = StartAs("ka", request);
    ASSERT_TRUE(client_.WaitForRequests(static_cast<size_t>(i) + 1));
    const std::string worker = client_.WaitForRequest().request_id();
    client_.Final(0, v1::FINISH_REASON_LENGTH, 0);
    const Received got = call->Finish();
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    ASSERT_FALSE(got.responses.empty());
    const std::string id = got.responses[0].request_id();
    // 128 random bits, not a counter: no client predicts another's next id.
    EXPECT_TRUE(IsRandomId(id)) << id;
    EXPECT_EQ(id, worker) << "a server-made id is the workers' id too (one id in the logs)";
    EXPECT_TRUE(seen.insert(id).second) << id;
  }
}

TEST_F(GenerateCallTenantTest, LimitsComeBeforeTheBodyIsTokenized) {
  auto running = StartAs("k1", TextRequest("Hi"));  // tenant "one": max_streams=1
  client_.WaitForRequest();
  // A second request of "one" whose prompt is over the size limit: refused for the tenant's
  // limit (429) before the body is looked at, not for its prompt (400) after tokenizing it.
  v1::GenerateRequest big = TextRequest(std::string(2 << 20, 'x'));
  big.clear_request_id();
  const Received got = StartAs("k1", big)->Finish();
  EXPECT_EQ(got.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << got.status.error_message();
  EXPECT_EQ(client_.requests(), 1u);
  client_.Final(0, v1::FINISH_REASON_LENGTH, 0);
  EXPECT_TRUE(running->Finish().status.ok());
}

}  // namespace
}  // namespace testing_generate_call
}  // namespace tandem
