#pragma once

// The NCCL sender's link to one receiver endpoint: the shell's peer (worker thread and queue,
// control_sender.h) with its communicator (rank 0), which the worker thread uses and the shell
// releases once the worker stopped.

#include <memory>

#include "kvtransfer/control_sender.h"
#include "kvtransfer/nccl/communicator.h"

namespace tandem::kvtransfer::nccl {

struct Peer : ControlPeer {
  std::unique_ptr<Communicator> comm;
};

}  // namespace tandem::kvtransfer::nccl
