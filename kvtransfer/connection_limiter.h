#pragma once

// Caps on the connections a listener holds -- in all and from one peer address -- and a memory
// budget their buffers are charged to before they are allocated. The tcp receiver and the device
// transports' control listener (control_rpc/) admit every accepted connection through one, so a
// flood from one address (or many) is refused before anything is read from it. Thread-safe.

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kvtransfer/transfer_hooks.h"

namespace tandem::kvtransfer {

class ConnectionLimiter {
 public:
  struct Limits {
    int max_connections = 128;          // open at once, all peers
    int max_connections_per_peer = 32;  // open at once from one peer address
    int64_t memory_budget = 0;          // bytes charged to all connections together
  };

  explicit ConnectionLimiter(const Limits& limits) : limits_(limits) {}

  // A new connection from `host`: admitted (counted, `charge` bytes charged) or
  // RESOURCE_EXHAUSTED saying which limit, with `*reason` set.
  absl::Status Admit(const std::string& host, int64_t charge, KvRefusal* reason);
  // An admitted connection from `host` closed; `charge` is what it still had charged.
  void Leave(const std::string& host, int64_t charge);

  // More (or fewer) bytes for an admitted connection. Charge is false, charging nothing, when
  // they do not fit the budget.
  bool Charge(int64_t bytes);
  void Release(int64_t bytes);

  // Counts a connection refused or closed for `reason` (and tells `hooks`, when not null) and
  // logs it: at most one line per 10 s, saying how many more were refused since the last one.
  void NoteRefused(KvRefusal reason, const std::string& peer, const absl::Status& why,
                   TransferHooks* hooks);

  int64_t charged() const;
  uint64_t refused() const;
  int64_t peak() const;  // the most ever charged at once
  int open() const;
  int open_from(const std::string& host) const;
  const Limits& limits() const { return limits_; }

 private:
  bool ChargeLocked(int64_t bytes);

  const Limits limits_;
  mutable std::mutex mu_;
  int open_ = 0;
  std::map<std::string, int> per_host_;  // hosts with open connections only
  int64_t charged_ = 0;
  int64_t peak_ = 0;
  uint64_t refused_ = 0;
  absl::Time last_refusal_log_ = absl::InfinitePast();
  uint64_t refusals_not_logged_ = 0;
};

// The address part of a peer name "host:port" / "[v6]:port": what the per-peer cap counts.
std::string PeerHost(const std::string& peer);

}  // namespace tandem::kvtransfer
