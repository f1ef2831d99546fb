#pragma once

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer {

// The live, thread-safe counters behind TransportStats.
struct StatsCounters {
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> frames{0};
  std::atomic<uint64_t> transfers_started{0};
  std::atomic<uint64_t> transfers_ok{0};
  std::atomic<uint64_t> transfers_failed{0};
  std::atomic<uint64_t> checksum_failures{0};
  std::atomic<uint64_t> deadline_expired{0};
  std::atomic<uint64_t> connects{0};
  std::atomic<uint64_t> handshakes_refused{0};
  std::atomic<uint64_t> connections_lost{0};
  std::atomic<uint64_t> faults_injected{0};
  std::atomic<uint64_t> connections_refused{0};
  std::atomic<uint64_t> messages_refused{0};
  std::atomic<uint64_t> buffer_bytes_peak{0};
  std::atomic<uint64_t> control_sent{0};
  std::atomic<uint64_t> control_received{0};
  std::atomic<uint64_t> device_copies{0};
  std::atomic<uint64_t> transfer_micros_sum{0};
  std::atomic<uint64_t> transfer_micros_max{0};

  void RecordLatency(absl::Duration d) {
    const uint64_t us = static_cast<uint64_t>(absl::ToInt64Microseconds(d));
    transfer_micros_sum.fetch_add(us, std::memory_order_relaxed);
    uint64_t cur = transfer_micros_max.load(std::memory_order_relaxed);
    while (us > cur && !transfer_micros_max.compare_exchange_weak(cur, us)) {
    }
  }

  TransportStats Snapshot() const {
    TransportStats s;
    s.bytes = bytes.load();
    s.frames = frames.load();
    s.transfers_started = transfers_started.load();
    s.transfers_ok = transfers_ok.load();
    s.transfers_failed = transfers_failed.load();
    s.checksum_failures = checksum_failures.load();
    s.deadline_expired = deadline_expired.load();
    s.connects = connects.load();
    s.handshakes_refused = handshakes_refused.load();
    s.connections_lost = connections_lost.load();
    s.faults_injected = faults_injected.load();
    s.connections_refused = connections_refused.load();
    s.messages_refused = messages_refused.load();
    s.buffer_bytes_peak = buffer_bytes_peak.load();
    s.control_sent = control_sent.load();
    s.control_received = control_received.load();
    s.device_copies = device_copies.load();
    s.transfer_micros_sum = transfer_micros_sum.load();
    s.transfer_micros_max = transfer_micros_max.load();
    return s;
  }
};

}  // namespace tandem::kvtransfer
