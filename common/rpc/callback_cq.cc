#include "common/rpc/callback_cq.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>

#include "absl/base/call_once.h"
#include "absl/synchronization/notification.h"

namespace tandem {

void PinCallbackCompletionQueue() {
  static absl::once_flag once;
  absl::call_once(once, [] {
    // A channel takes its reference on the queue at its first callback call and holds it until
    // the channel is destroyed: one call whose deadline has already passed (it never reaches
    // the network) on a channel that is never destroyed.
    static auto* const pin = new std::shared_ptr<grpc::Channel>(grpc::CreateChannel(
        "unix:/nonexistent/tandem-callback-cq-pin", grpc::InsecureChannelCredentials()));
    grpc::GenericStub stub(*pin);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now());
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1), response;
    absl::Notification done;
    stub.UnaryCall(&context, "/tandem.v1.Pin/Pin", grpc::StubOptions(), &request, &response,
                   [&done](grpc::Status) { done.Notify(); });
    done.WaitForNotification();
  });
}

}  // namespace tandem
