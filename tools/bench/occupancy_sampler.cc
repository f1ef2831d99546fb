#include "tools/bench/occupancy_sampler.h"

#include "absl/strings/str_cat.h"

namespace tandem::bench {

int64_t Int64FieldOrMinusOne(const google::protobuf::Message& message, const std::string& name) {
  const google::protobuf::FieldDescriptor* field = message.GetDescriptor()->FindFieldByName(name);
  if (field == nullptr || field->is_repeated() ||
      field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_INT64) {
    return -1;
  }
  return message.GetReflection()->GetInt64(message, field);
}

OccupancySampler::OccupancySampler(std::vector<std::shared_ptr<grpc::Channel>> stats_channels,
                                   double interval_s, Clock::time_point origin,
                                   std::function<LiveSlots()> live_slots)
    : interval_s_(interval_s), origin_(origin), live_slots_(std::move(live_slots)) {
  for (auto& channel : stats_channels) {
    stubs_.push_back(v1::Worker::NewStub(channel));
    admin_stubs_.push_back(v1::RouterAdmin::NewStub(channel));
  }
  target_dead_.assign(stubs_.size(), false);
  use_admin_.assign(stubs_.size(), false);
}

OccupancySampler::~OccupancySampler() { Stop(); }

void OccupancySampler::Start() {
  if (interval_s_ <= 0) return;
  thread_ = std::thread([this] { Loop(); });
}

void OccupancySampler::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<OccupancySample> OccupancySampler::samples() const {
  std::lock_guard<std::mutex> lock(mu_);
  return samples_;
}

std::string OccupancySampler::server_note() const {
  std::lock_guard<std::mutex> lock(mu_);
  return server_note_;
}

void OccupancySampler::Loop() {
  const auto interval = std::chrono::microseconds(static_cast<int64_t>(interval_s_ * 1e6));
  auto next = Clock::now() + interval;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_until(lock, next, [this] { return stop_; })) return;
    }
    OccupancySample sample = TakeSample();
    std::lock_guard<std::mutex> lock(mu_);
    samples_.push_back(sample);
    next += interval;
    if (next < Clock::now()) next = Clock::now() + interval;
  }
}

grpc::Status OccupancySampler::GetStats(size_t i, v1::WorkerStats* stats) {
  auto refused = [](const grpc::Status& st) {
    return st.error_code() == grpc::StatusCode::UNIMPLEMENTED ||
           st.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
           st.error_code() == grpc::StatusCode::UNAUTHENTICATED;
  };
  if (!use_admin_[i]) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    const grpc::Status status = stubs_[i]->GetStats(&context, v1::StatsRequest(), stats);
    if (!refused(status)) return status;
    use_admin_[i] = true;
  }
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::ClusterStatus cluster;
  grpc::Status status =
      admin_stubs_[i]->GetClusterStatus(&context, v1::ClusterStatusRequest(), &cluster);
  if (!status.ok()) {
    return refused(status) ? grpc::Status(grpc::StatusCode::UNIMPLEMENTED, status.error_message())
                           : status;
  }
  // The decode side holds the load and the KV that the occupancy is about.
  for (const v1::WorkerStatus& w : cluster.workers()) {
    if (w.role() != "decode" && w.role() != "both") continue;
    const v1::WorkerStats& ws = w.stats();
    stats->set_running(stats->running() + ws.running());
    stats->set_waiting(stats->waiting() + ws.waiting());
    stats->set_kv_blocks_used(stats->kv_blocks_used() + ws.kv_blocks_used());
    stats->set_kv_blocks_total(stats->kv_blocks_total() + ws.kv_blocks_total());
    stats->set_steps(stats->steps() + ws.steps());
    stats->set_generated_tokens(stats->generated_tokens() + ws.generated_tokens());
    stats->set_kv_reserved_token_slots(stats->kv_reserved_token_slots() +
                                       ws.kv_reserved_token_slots());
    stats->set_kv_filled_token_slots(stats->kv_filled_token_slots() + ws.kv_filled_token_slots());
  }
  return grpc::Status::OK;
}

OccupancySample OccupancySampler::TakeSample() {
  OccupancySample s;
  s.t_s = SecondsBetween(origin_, Clock::now());
  const LiveSlots live = live_slots_();
  s.model = live.slots;
  s.model_sequences = live.sequences;
  bool all_slots = true;
  for (size_t i = 0; i < stubs_.size(); ++i) {
    if (target_dead_[i]) continue;
    v1::WorkerStats stats;
    const grpc::Status status = GetStats(i, &stats);
    if (!status.ok()) {
      if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED) target_dead_[i] = true;
      std::lock_guard<std::mutex> lock(mu_);
      server_note_ =
          absl::StrCat(use_admin_[i] ? "RouterAdmin.GetClusterStatus" : "Worker.GetStats",
                       " on stats target ", i, ": ", StatusText(status));
      continue;
    }
    s.has_server = true;
    s.running += stats.running();
    s.waiting += stats.waiting();
    s.kv_blocks_used += stats.kv_blocks_used();
    s.kv_blocks_total += stats.kv_blocks_total();
    s.steps += stats.steps();
    s.generated_tokens += stats.generated_tokens();
    const int64_t reserved = Int64FieldOrMinusOne(stats, "kv_reserved_token_slots");
    const int64_t filled = Int64FieldOrMinusOne(stats, "kv_filled_token_slots");
    if (reserved < 0 || filled < 0) {
      all_slots = false;
    } else {
      s.reserved_slots = std::max<int64_t>(s.reserved_slots, 0) + reserved;
      s.filled_slots = std::max<int64_t>(s.filled_slots, 0) + filled;
    }
  }
  if (!all_slots) s.reserved_slots = s.filled_slots = -1;
  return s;
}

}  // namespace tandem::bench
