#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "kvtransfer/transport.h"

namespace tandem::kvtransfer::testing {

// A receiver for the control listener's tests: answers every control message with "echo:" and
// the message, and counts them.
class EchoReceiver : public KvReceiver {
 public:
  std::string endpoint() const override { return "echo"; }
  uint64_t incarnation() const override { return 1; }
  void Expect(const Expectation&) override {}
  void Cancel(uint64_t, ReleasedCallback released) override { released(); }
  int64_t num_in_flight() const override { return 0; }
  absl::StatusOr<std::string> HandleControl(const std::string& request) override {
    ++handled;
    return "echo:" + request;
  }
  std::atomic<int> handled{0};
};

}  // namespace tandem::kvtransfer::testing
