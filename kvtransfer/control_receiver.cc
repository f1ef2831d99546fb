#include "kvtransfer/control_receiver.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "kvtransfer/control_message.h"

namespace tandem::kvtransfer {

void AttemptOutcome::Set(const absl::Status& s) {
  std::lock_guard<std::mutex> lock(mu);
  if (set) return;
  set = true;
  status = s;
  cv.notify_all();
}

absl::Status CheckIncarnation(const wire::Begin& b, uint64_t incarnation) {
  if (b.incarnation == incarnation) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "receiver incarnation is ", incarnation, ", transfer was reserved under ", b.incarnation));
}

ReceiverCore::AttemptStart AttemptFromBegin(wire::Begin b, uint64_t owner, uint64_t sender_id) {
  ReceiverCore::AttemptStart start;
  start.proof = std::move(b.proof);
  start.binding = ControlBinding(sender_id);
  start.transfer_id = b.transfer_id;
  start.attempt = b.attempt;
  start.dst_blocks = std::move(b.dst_blocks);
  start.owner = owner;
  start.deadline =
      b.deadline_ms < 0 ? absl::InfiniteFuture() : absl::Now() + absl::Milliseconds(b.deadline_ms);
  return start;
}

absl::Status SenderAborted(const absl::Status& status) {
  return absl::Status(status.ok() ? absl::StatusCode::kAborted : status.code(),
                      absl::StrCat("sender aborted: ", status.message()));
}

std::string FinishReply(ReceiverCore* core, uint64_t owner, wire::Finish f,
                        const std::shared_ptr<AttemptOutcome>& outcome) {
  absl::Status s =
      core->Finish(owner, f.transfer_id, f.attempt, f.frames, f.bytes, std::move(f.trailer));
  if (!s.ok()) return ResultReply(f.transfer_id, f.attempt, s);
  if (!outcome) return ResultReply(f.transfer_id, f.attempt, absl::OkStatus());
  std::unique_lock<std::mutex> lock(outcome->mu);
  if (!outcome->cv.wait_for(lock, std::chrono::seconds(10), [&] { return outcome->set; })) {
    return ResultReply(f.transfer_id, f.attempt, absl::UnavailableError("outcome unknown"));
  }
  return ResultReply(f.transfer_id, f.attempt, outcome->status);
}

}  // namespace tandem::kvtransfer
