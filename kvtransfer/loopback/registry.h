#pragma once

// The loopback transport's process-wide registry: endpoint name -> receiver.

#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"
#include "kvtransfer/receiver_core.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer::loopback {

// A receiver as senders see it. Senders hold `mu` shared while they work on `core`; the
// receiver takes it exclusively to retire (alive = false) before it goes away.
struct Peer {
  std::shared_mutex mu;
  bool alive = true;
  ReceiverCore* core = nullptr;
  KvLayout layout;
  uint64_t incarnation = 0;
};

class Registry {
 public:
  static Registry& Get();
  absl::Status Add(const std::string& name, std::shared_ptr<Peer> peer);
  void Remove(const std::string& name);
  std::shared_ptr<Peer> Find(const std::string& name);
  std::string UniqueName();

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Peer>> peers_;
  uint64_t counter_ = 0;
};

}  // namespace tandem::kvtransfer::loopback
