#pragma once

// The NCCL sender's link to one receiver endpoint: the shell's peer (worker and finisher threads,
// control_sender.h) with its communicator (rank 0) and the transfers with messages in flight on
// it, which the shell releases once both threads stopped.

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kvtransfer/control_sender.h"
#include "kvtransfer/nccl/communicator.h"

namespace tandem::kvtransfer::nccl {

// A transfer with messages enqueued on the communicator's stream and not yet waited for: the
// read of its source regions the sender keeps (SenderCore::StartRead), the header slots of its
// messages and the event recorded behind its latest message.
struct InFlight {
  std::shared_ptr<SenderTransfer> transfer;
  void* event = nullptr;  // cudaEvent_t
  std::vector<HeaderSlot> slots;
};

struct Peer : ControlPeer {
  std::unique_ptr<Communicator> comm;
  // The receiver's WELCOME: at most this many regions adjacent on both sides go in one ncclSend
  // (1: its consecutive block ids are not adjacent, nothing merges).
  uint32_t max_run_regions = 1;
  // The worker adds messages (SendData), the finisher settles them (SettleReads).
  std::mutex flight_mu;
  std::unordered_map<const SenderTransfer*, InFlight> in_flight;
  std::vector<void*> spare_events;  // completed, for reuse
  // Of transfers whose messages failed: freed once the communicator is gone.
  std::vector<HeaderSlot> orphan_slots;
  std::vector<void*> orphan_events;
};

}  // namespace tandem::kvtransfer::nccl
