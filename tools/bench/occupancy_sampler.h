#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tandem/v1/router_admin.grpc.pb.h"
#include "tandem/v1/worker.grpc.pb.h"
#include "tools/bench/kv_occupancy.h"
#include "tools/bench/stream_call.h"

namespace tandem::bench {

// One look at the server's load and KV occupancy during the run.
struct OccupancySample {
  double t_s = 0;  // since the run's origin
  // The client's model of the running sequences' KV slots (tokens received so far).
  KvSlots model;
  int64_t model_sequences = 0;
  // Worker.GetStats summed over the stats targets; has_server false when none answered.
  bool has_server = false;
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  // Cumulative engine counters (WorkerStats.steps, generated_tokens): their growth between two
  // samples gives the tokens generated per engine step, the batch size steps actually ran at.
  int64_t steps = 0;
  int64_t generated_tokens = 0;
  // WorkerStats.kv_reserved_token_slots / kv_filled_token_slots when the server's proto has
  // them (read by field name), else -1.
  int64_t reserved_slots = -1;
  int64_t filled_slots = -1;
};

// Samples every interval on its own thread: the client's live KV model (from `live_slots`)
// and Worker.GetStats of each stats target (a monolithic `tandem serve` serves the Worker API
// on its client port; a cluster's workers have their own ports).
class OccupancySampler {
 public:
  struct LiveSlots {
    KvSlots slots;
    int64_t sequences = 0;
  };
  OccupancySampler(std::vector<std::shared_ptr<grpc::Channel>> stats_channels, double interval_s,
                   Clock::time_point origin, std::function<LiveSlots()> live_slots);
  ~OccupancySampler();

  void Start();
  void Stop();
  std::vector<OccupancySample> samples() const;
  // Why server samples are missing, if they are ("" when every target answered).
  std::string server_note() const;

 private:
  void Loop();
  OccupancySample TakeSample();

  // A target's stats: Worker.GetStats (a worker), or RouterAdmin's view of its workers where
  // the Worker API is not offered (`tandem serve`, a router).
  grpc::Status GetStats(size_t target, v1::WorkerStats* stats);
  std::vector<std::unique_ptr<v1::Worker::Stub>> stubs_;
  std::vector<std::unique_ptr<v1::RouterAdmin::Stub>> admin_stubs_;
  std::vector<bool> use_admin_;
  double interval_s_;
  Clock::time_point origin_;
  std::function<LiveSlots()> live_slots_;
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<OccupancySample> samples_;
  std::string server_note_;
  std::vector<bool> target_dead_;
};

// An int64 field of a message by name, or -1 when the message type has no such field.
int64_t Int64FieldOrMinusOne(const google::protobuf::Message& message, const std::string& name);

}  // namespace tandem::bench
