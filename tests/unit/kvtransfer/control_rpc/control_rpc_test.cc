// The KvControl service's authentication with a shared secret: the right proof passes once;
// the same request sent again (a replay of a captured message), one outside the time window,
// one without or with a wrong proof, and one whose nonce or time was altered are refused before
// the receiver sees them; replies are proven back.

#include "kvtransfer/control_rpc/control_rpc.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtransfer/auth.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tests/unit/kvtransfer/control_rpc/echo_receiver.h"

namespace tandem::kvtransfer {
namespace {

constexpr char kSecret[] = "0123456789abcdef-secret";

using testing::EchoReceiver;

class ControlRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = KvControlServer::Start("127.0.0.1", 0, TlsOptions(), kSecret);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    server_->SetReceiver(&receiver_);
    endpoint_ = absl::StrCat("127.0.0.1:", server_->port());
    stub_ =
        v1::KvControl::NewStub(grpc::CreateChannel(endpoint_, grpc::InsecureChannelCredentials()));
  }

  v1::KvControlMessage Signed(const std::string& message, absl::Time at = absl::Now()) {
    v1::KvControlMessage m;
    m.set_message(message);
    m.set_nonce(*NewNonce());
    m.set_unix_ms(absl::ToUnixMillis(at));
    m.set_proof(ControlRequestProof(kSecret, m.unix_ms(), m.nonce(), message));
    return m;
  }

  grpc::Status Send(const v1::KvControlMessage& m, v1::KvControlMessage* reply = nullptr) {
    grpc::ClientContext context;
    v1::KvControlMessage ignored;
    return stub_->Exchange(&context, m, reply != nullptr ? reply : &ignored);
  }

  EchoReceiver receiver_;
  std::unique_ptr<KvControlServer> server_;
  std::string endpoint_;
  std::unique_ptr<v1::KvControl::Stub> stub_;
};

TEST_F(ControlRpcTest, ARequestPassesOnceAndItsReplayIsRefused) {
  v1::KvControlMessage m = Signed("begin");
  v1::KvControlMessage reply;
  grpc::Status st = Send(m, &reply);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(reply.message(), "echo:begin");
  EXPECT_TRUE(ProofMatches(reply.proof(), ControlReplyProof(kSecret, m.proof(), reply.message())));
  st = Send(m);  // the same bytes again, as an attacker who captured them would send them
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(st.error_message().find("replay"), std::string::npos) << st.error_message();
  EXPECT_EQ(receiver_.handled, 1);
}

TEST_F(ControlRpcTest, RefusedBeforeTheReceiverSeesThem) {
  v1::KvControlMessage old = Signed("begin", absl::Now() - absl::Minutes(5));
  EXPECT_EQ(Send(old).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  v1::KvControlMessage unsigned_message;
  unsigned_message.set_message("begin");
  EXPECT_EQ(Send(unsigned_message).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  v1::KvControlMessage retimed = Signed("begin");  // a fresh time on a captured proof
  retimed.set_unix_ms(retimed.unix_ms() + 1);
  EXPECT_EQ(Send(retimed).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  v1::KvControlMessage renonced = Signed("begin");  // a new nonce on a captured proof
  renonced.set_nonce(*NewNonce());
  EXPECT_EQ(Send(renonced).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  v1::KvControlMessage wrong = Signed("begin");
  wrong.set_proof(
      ControlRequestProof("another-secret-0123456", wrong.unix_ms(), wrong.nonce(), "begin"));
  EXPECT_EQ(Send(wrong).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(receiver_.handled, 0);
}

// The channel the prefill workers use signs each request afresh: repeated identical messages all
// pass (each has its own nonce).
TEST_F(ControlRpcTest, TheChannelSignsEveryRequestAfresh) {
  auto channel = MakeGrpcControlChannel(TlsOptions(), kSecret, absl::Seconds(10));
  ASSERT_TRUE(channel.ok()) << channel.status();
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::string> reply = (*channel)(endpoint_, "finish");
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_EQ(*reply, "echo:finish");
  }
  auto wrong = MakeGrpcControlChannel(TlsOptions(), "another-secret-0123456", absl::Seconds(10));
  EXPECT_EQ((*wrong)(endpoint_, "finish").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(receiver_.handled, 3);
}

}  // namespace
}  // namespace tandem::kvtransfer
