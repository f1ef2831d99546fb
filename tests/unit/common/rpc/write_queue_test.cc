// WriteQueue: one write at a time, Finish once and only after the queue drained, Clear drops
// what was not written, and the owner's lock is released around every reactor call. The reactor
// is bound to a recording stream, so every StartWrite / Finish it makes is seen here.

#include "common/rpc/write_queue.h"

#include <grpcpp/grpcpp.h>

#include <mutex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tandem/v1/worker.pb.h"

namespace tandem {
namespace {

// What a server-streaming call would do with the reactor's operations, recorded.
class RecordingWriter : public grpc::ServerCallbackWriter<grpc::ByteBuffer> {
 public:
  explicit RecordingWriter(std::mutex* owner_mu) : owner_mu_(owner_mu) {}
  void Bind(grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor) {
    reactor_ = reactor;
    BindReactor(reactor);
  }

  void Finish(grpc::Status s) override {
    CheckOwnerUnlocked();
    finishes.push_back(s.error_code());
  }
  void SendInitialMetadata() override {}
  void Write(const grpc::ByteBuffer* msg, grpc::WriteOptions) override {
    CheckOwnerUnlocked();
    v1::DecodeResponse r;
    ASSERT_TRUE(ParseRawRequest(*msg, &r).ok());
    writes.push_back(r.tokens().index());
  }
  void WriteAndFinish(const grpc::ByteBuffer*, grpc::WriteOptions, grpc::Status) override {
    ADD_FAILURE() << "WriteQueue never combines a write with the finish";
  }

  std::vector<int32_t> writes;  // the index of each message written
  std::vector<grpc::StatusCode> finishes;
  bool owner_locked_in_call = false;

 private:
  grpc::internal::ServerReactor* reactor() override { return reactor_; }
  void CallOnDone() override {}
  // The queue must not hold the owner's mutex while calling into gRPC.
  void CheckOwnerUnlocked() {
    if (!owner_mu_->try_lock()) {
      owner_locked_in_call = true;
    } else {
      owner_mu_->unlock();
    }
  }

  std::mutex* owner_mu_;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor_ = nullptr;
};

class Reactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  void OnDone() override {}
};

v1::DecodeResponse Message(int32_t index) {
  v1::DecodeResponse r;
  r.mutable_tokens()->set_index(index);
  return r;
}

class WriteQueueTest : public ::testing::Test {
 protected:
  WriteQueueTest() : writer_(&mu_) { writer_.Bind(&reactor_); }

  // Pumps as an owner does: under its mutex; the lock is held again on return.
  void Pump(const std::optional<grpc::Status>& final_status = std::nullopt) {
    std::unique_lock<std::mutex> lock(mu_);
    queue_.Pump(&reactor_, lock, final_status);
    EXPECT_TRUE(lock.owns_lock());
  }

  std::mutex mu_;
  Reactor reactor_;
  RecordingWriter writer_;
  WriteQueue<v1::DecodeResponse> queue_;
};

TEST_F(WriteQueueTest, OneWriteAtATimeInOrder) {
  queue_.Push(Message(1));
  queue_.Push(Message(2));
  queue_.Push(Message(3));
  Pump();
  Pump();  // the first write has not completed: nothing more starts
  EXPECT_EQ(writer_.writes, std::vector<int32_t>({1}));
  queue_.WriteDone();
  Pump();
  EXPECT_EQ(writer_.writes, std::vector<int32_t>({1, 2}));
  queue_.WriteDone();
  Pump();
  queue_.WriteDone();
  Pump();  // empty and no final status: nothing to do
  EXPECT_EQ(writer_.writes, std::vector<int32_t>({1, 2, 3}));
  EXPECT_TRUE(writer_.finishes.empty());
  EXPECT_FALSE(writer_.owner_locked_in_call);
}

TEST_F(WriteQueueTest, FinishWaitsForTheQueueToDrain) {
  queue_.Push(Message(1));
  queue_.Push(Message(2));
  const grpc::Status done = grpc::Status::OK;
  Pump(done);
  EXPECT_TRUE(writer_.finishes.empty());  // message 1 is in flight
  queue_.WriteDone();
  Pump(done);
  EXPECT_TRUE(writer_.finishes.empty());  // message 2 goes before the finish
  EXPECT_FALSE(queue_.finish_called());
  queue_.WriteDone();
  Pump(done);
  EXPECT_EQ(writer_.writes, std::vector<int32_t>({1, 2}));
  ASSERT_EQ(writer_.finishes.size(), 1u);
  EXPECT_EQ(writer_.finishes[0], grpc::StatusCode::OK);
  EXPECT_TRUE(queue_.finish_called());
  // After the finish nothing is written or finished again.
  queue_.Push(Message(3));
  Pump(grpc::Status(grpc::StatusCode::INTERNAL, "late"));
  EXPECT_EQ(writer_.writes, std::vector<int32_t>({1, 2}));
  EXPECT_EQ(writer_.finishes.size(), 1u);
  EXPECT_FALSE(writer_.owner_locked_in_call);
}

TEST_F(WriteQueueTest, ClearDropsWhatWasNotWritten) {
  queue_.Push(Message(1));
  queue_.Push(Message(2));
  queue_.Push(Message(3));
  Pump();
  queue_.Clear();  // the peer went away while message 1 was in flight
  queue_.WriteDone();
  Pump(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  EXPECT_EQ(writer_.writes, std::vector<int32_t>({1}));
  ASSERT_EQ(writer_.finishes.size(), 1u);
  EXPECT_EQ(writer_.finishes[0], grpc::StatusCode::CANCELLED);
}

TEST_F(WriteQueueTest, FinishWithNothingQueuedIsImmediate) {
  Pump(grpc::Status(grpc::StatusCode::UNAVAILABLE, "draining"));
  EXPECT_TRUE(writer_.writes.empty());
  ASSERT_EQ(writer_.finishes.size(), 1u);
  EXPECT_EQ(writer_.finishes[0], grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace tandem
