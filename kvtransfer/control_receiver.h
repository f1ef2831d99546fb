#pragma once

// What the receivers of the device transports (nccl, cuda-ipc) share in answering control
// messages (control_message.h): the outcome a FINISH reply waits for, BEGIN's incarnation check
// and the attempt it starts, the status of an attempt the sender aborted, and the FINISH reply.

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "kvtransfer/receiver_core.h"
#include "kvtransfer/tcp/wire.h"

namespace tandem::kvtransfer {

// How an attempt ended, for the FINISH reply. Set once (the first call wins).
struct AttemptOutcome {
  uint64_t owner = 0;  // the sender's owner id in the core
  std::mutex mu;
  bool set = false;
  absl::Status status;
  std::condition_variable cv;
  void Set(const absl::Status& s);
};

// FAILED_PRECONDITION when BEGIN's transfer was reserved under another incarnation than this
// receiver's.
absl::Status CheckIncarnation(const wire::Begin& b, uint64_t incarnation);

// The attempt BEGIN from sender `sender_id` starts on its owner id `owner` (its deadline
// relative to now; its proof of the transfer key bound to the sender id).
ReceiverCore::AttemptStart AttemptFromBegin(wire::Begin b, uint64_t owner, uint64_t sender_id);

// What an attempt ends with when the sender aborted it with `status` (ABORTED when OK).
absl::Status SenderAborted(const absl::Status& status);

// The RESULT answering FINISH `f` from `owner`: the core's check of the attempt, then its
// outcome (waited for at most 10 s; UNAVAILABLE when still unknown), OK when there is no
// `outcome` to wait for.
std::string FinishReply(ReceiverCore* core, uint64_t owner, wire::Finish f,
                        const std::shared_ptr<AttemptOutcome>& outcome);

}  // namespace tandem::kvtransfer
