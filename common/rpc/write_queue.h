#pragma once

#include <grpcpp/grpcpp.h>

#include <deque>
#include <mutex>
#include <optional>
#include <utility>

#include "common/rpc/byte_buffer.h"

namespace tandem {

// The write side of a raw server-streaming reactor fed from other threads (the engine thread,
// a worker stream). Messages queue under the owning call's mutex; only the holder of the writer
// role calls StartWrite or Finish, so every write completes before the next starts and Finish
// comes once, after the queue drained. Every member requires the owner's mutex.
template <class Message>
class WriteQueue {
 public:
  void Push(Message message) { queue_.push_back(std::move(message)); }
  // Drops what was not written yet (the peer went away or cancelled).
  void Clear() { queue_.clear(); }
  // From the reactor's OnWriteDone: the writer role is free again.
  void WriteDone() { writing_ = false; }
  bool finish_called() const { return finish_called_; }

  // Starts the next write, or, with the queue empty and `final_status` set, the Finish, when
  // nobody holds the writer role. Releases `lock` (the owner's mutex) around the reactor call.
  void Pump(grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor, std::unique_lock<std::mutex>& lock,
            const std::optional<grpc::Status>& final_status) {
    if (writing_ || finish_called_) return;
    if (!queue_.empty()) {
      writing_ = true;
      in_flight_ = SerializeToByteBuffer(queue_.front());
      queue_.pop_front();
      lock.unlock();
      reactor->StartWrite(&in_flight_);
      lock.lock();
      return;
    }
    if (final_status.has_value()) {
      finish_called_ = true;
      const grpc::Status status = *final_status;
      lock.unlock();
      reactor->Finish(status);
      lock.lock();
    }
  }

 private:
  std::deque<Message> queue_;
  grpc::ByteBuffer in_flight_;  // the message being written
  bool writing_ = false;
  bool finish_called_ = false;
};

}  // namespace tandem
