// A channel whose last reference is dropped inside one of its own callbacks, with no other
// callback channel in the process: without the pin, gRPC 1.51 frees its callback completion
// queue under the thread running that callback (ASan: double free; otherwise a crash or hang).

#include "common/rpc/callback_cq.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "absl/synchronization/notification.h"

namespace tandem {
namespace {

// One callback call on a fresh channel; the callback deletes the call's state (its context holds
// the channel), dropping the only reference to the channel.
void CallAndDropChannelInCallback() {
  struct Call {
    std::shared_ptr<grpc::Channel> channel;
    grpc::ClientContext context;
    grpc::Slice empty{""};
    grpc::ByteBuffer request{&empty, 1}, response;
  };
  auto* call = new Call;
  call->channel = grpc::CreateChannel("unix:/nonexistent/tandem-callback-cq-test",
                                      grpc::InsecureChannelCredentials());
  // Waits for a connection that never comes, so the call ends at its deadline, well after the
  // stub (which shares the channel) is gone.
  call->context.set_wait_for_ready(true);
  call->context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  absl::Notification done;
  grpc::StatusCode code = grpc::StatusCode::OK;
  grpc::GenericStub(call->channel)
      .UnaryCall(&call->context, "/tandem.v1.Test/Test", grpc::StubOptions(), &call->request,
                 &call->response, [call, &done, &code](grpc::Status status) {
                   code = status.error_code();
                   delete call;  // the last reference: ~Channel on the callback's thread
                   done.Notify();
                 });
  call = nullptr;  // owned by the callback
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(code, grpc::StatusCode::DEADLINE_EXCEEDED) << "there is no server";
}

TEST(CallbackCqTest, ChannelDestroyedInItsOwnCallbackLeavesTheQueueUsable) {
  PinCallbackCompletionQueue();
  PinCallbackCompletionQueue();  // once per process; the second call is a no-op
  for (int i = 0; i < 20; ++i) CallAndDropChannelInCallback();
}

}  // namespace
}  // namespace tandem
