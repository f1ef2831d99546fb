#include "tools/bench/bench_runner.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rpc/callback_cq.h"
#include "tandem/v1/generation.grpc.pb.h"
#include "tools/bench/kv_occupancy.h"
#include "tools/bench/occupancy_sampler.h"
#include "tools/bench/stream_call.h"

namespace tandem::bench {
namespace {

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target) {
  PinCallbackCompletionQueue();  // the streams' reactors run on it
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

absl::Status Connect(grpc::Channel* channel, const std::string& target, double timeout_s) {
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1e3));
  if (channel->WaitForConnected(deadline)) return absl::OkStatus();
  return absl::UnavailableError(absl::StrFormat(
      "cannot reach a Tandem server at %s within %.0f s (is `tandem serve` running there?)", target,
      timeout_s));
}

// Dispatches the requests of one phase (warmup or measured) and collects their results.
class Phase {
 public:
  Phase(const BenchOptions& options, v1::Generation::Stub* stub, Workload* workload,
        const std::string& model, bool warmup)
      : options_(options), stub_(stub), workload_(workload), warmup_(warmup) {
    settings_.model = model;
    settings_.ignore_eos = options.ignore_eos;
    settings_.temperature = options.temperature;
    settings_.timeout_s = options.request_timeout_s;
    settings_.tokens_received = &tokens_;
  }

  std::vector<CallResult> Run(int64_t num_requests, double duration_s,
                              std::vector<std::shared_ptr<grpc::Channel>> stats_channels,
                              std::vector<OccupancySample>* samples, std::string* server_note,
                              LoadWindow* window);

 private:
  void Issue();
  void OnDone(CallResult result);
  OccupancySampler::LiveSlots LiveSlots();
  void ProgressLoop(int64_t num_requests, double duration_s);
  void PrintProgress(int64_t num_requests, double duration_s, bool last);

  const BenchOptions& options_;
  v1::Generation::Stub* stub_;
  Workload* workload_;
  bool warmup_;
  CallSettings settings_;
  std::atomic<int64_t> tokens_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t in_flight_ = 0;
  int64_t issued_ = 0;
  int64_t failed_ = 0;
  bool finished_ = false;
  std::map<int64_t, std::shared_ptr<LiveCall>> live_;
  std::vector<CallResult> results_;
};

std::vector<CallResult> Phase::Run(int64_t num_requests, double duration_s,
                                   std::vector<std::shared_ptr<grpc::Channel>> stats_channels,
                                   std::vector<OccupancySample>* samples, std::string* server_note,
                                   LoadWindow* window) {
  settings_.origin = Clock::now();
  const Clock::time_point end =
      duration_s > 0
          ? settings_.origin + std::chrono::microseconds(static_cast<int64_t>(duration_s * 1e6))
          : Clock::time_point::max();
  std::unique_ptr<OccupancySampler> sampler;
  if (samples != nullptr && options_.sample_interval_s > 0) {
    sampler =
        std::make_unique<OccupancySampler>(std::move(stats_channels), options_.sample_interval_s,
                                           settings_.origin, [this] { return LiveSlots(); });
    sampler->Start();
  }
  std::thread progress;
  if (options_.progress_interval_s > 0) {
    progress =
        std::thread([this, num_requests, duration_s] { ProgressLoop(num_requests, duration_s); });
  }
  std::unique_ptr<PoissonArrivals> arrivals;
  if (options_.request_rate > 0) {
    arrivals = std::make_unique<PoissonArrivals>(options_.request_rate,
                                                 options_.workload.seed * 7919 + warmup_);
  }
  Clock::time_point next_start = settings_.origin;
  while (num_requests <= 0 || issued_ < num_requests) {
    if (arrivals != nullptr) {
      if (next_start >= end) break;
      std::this_thread::sleep_until(next_start);
      next_start +=
          std::chrono::microseconds(static_cast<int64_t>(arrivals->NextGapSeconds() * 1e6));
    }
    std::unique_lock<std::mutex> lock(mu_);
    const auto has_room = [this] {
      return options_.concurrency <= 0 || in_flight_ < options_.concurrency;
    };
    if (end == Clock::time_point::max()) {
      cv_.wait(lock, has_room);
    } else if (!cv_.wait_until(lock, end, has_room) || Clock::now() >= end) {
      break;
    }
    ++in_flight_;
    ++issued_;
    lock.unlock();
    Issue();
  }
  if (window != nullptr) {
    const Clock::time_point now = Clock::now();
    window->seconds = SecondsBetween(settings_.origin, std::min(now, end));
    window->output_tokens = tokens_.load();
  }
  if (options_.cut_at_end && duration_s > 0 && !warmup_) {
    std::vector<std::shared_ptr<LiveCall>> running;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [index, call] : live_) running.push_back(call);
    }
    for (auto& call : running) call->Cut();  // unlocked: OnDone may run inline
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return in_flight_ == 0; });
    finished_ = true;
  }
  cv_.notify_all();
  if (progress.joinable()) progress.join();
  if (sampler != nullptr) {
    sampler->Stop();
    *samples = sampler->samples();
    *server_note = sampler->server_note();
  }
  std::lock_guard<std::mutex> lock(mu_);
  return std::move(results_);
}

void Phase::Issue() {
  const RequestSpec spec = workload_->Next();
  auto live = std::make_shared<LiveCall>();
  live->prompt_tokens = static_cast<int32_t>(spec.prompt.size());
  live->max_tokens = spec.max_tokens;
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_[spec.index] = live;
  }
  StreamCall::Start(stub_, spec, settings_, live,
                    [this](CallResult result) { OnDone(std::move(result)); });
}

void Phase::OnDone(CallResult result) {
  // Notified under the lock: once in_flight_ reaches 0 the phase may end and be destroyed.
  std::lock_guard<std::mutex> lock(mu_);
  live_.erase(result.index);
  if (!result.ok && !result.cancelled) ++failed_;
  results_.push_back(std::move(result));
  --in_flight_;
  cv_.notify_all();
}

OccupancySampler::LiveSlots Phase::LiveSlots() {
  OccupancySampler::LiveSlots out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [index, call] : live_) {
    const int32_t received = call->received.load(std::memory_order_relaxed);
    if (received <= 0 || received >= call->max_tokens) continue;  // not running
    out.slots +=
        SlotsOfSequence(call->prompt_tokens, call->prompt_tokens + received - 1, call->max_tokens,
                        options_.block_size, options_.workload.max_model_len);
    ++out.sequences;
  }
  return out;
}

void Phase::ProgressLoop(int64_t num_requests, double duration_s) {
  const auto interval =
      std::chrono::milliseconds(static_cast<int64_t>(options_.progress_interval_s * 1e3));
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, interval, [this] { return finished_; })) {
    lock.unlock();
    PrintProgress(num_requests, duration_s, false);
    lock.lock();
  }
  lock.unlock();
  PrintProgress(num_requests, duration_s, true);
}

void Phase::PrintProgress(int64_t num_requests, double duration_s, bool last) {
  static const bool tty = isatty(STDERR_FILENO);
  const double t = SecondsBetween(settings_.origin, Clock::now());
  int64_t done, in_flight, failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done = static_cast<int64_t>(results_.size());
    in_flight = in_flight_;
    failed = failed_;
  }
  const int64_t tokens = tokens_.load();
  std::string goal = num_requests > 0 ? absl::StrCat("/", num_requests) : "";
  if (duration_s > 0) absl::StrAppend(&goal, absl::StrFormat(" (issuing for %.0f s)", duration_s));
  const std::string line = absl::StrFormat(
      "[bench%s] %6.1f s | done %lld%s | in flight %lld | failed %lld | %lld tokens, %.1f tok/s",
      warmup_ ? " warmup" : "", t, static_cast<long long>(done), goal,
      static_cast<long long>(in_flight), static_cast<long long>(failed),
      static_cast<long long>(tokens), t > 0 ? tokens / t : 0.0);
  if (tty) {
    std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), last ? "\n" : "");
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

}  // namespace

absl::StatusOr<BenchReport> RunBench(const BenchOptions& options) {
  if (options.request_rate <= 0 && options.concurrency < 1) {
    return absl::InvalidArgumentError("concurrency must be >= 1 without a request rate");
  }
  if (options.num_requests <= 0 && options.duration_s <= 0) {
    return absl::InvalidArgumentError("set a number of requests or a duration");
  }
  auto channel = MakeChannel(options.target);
  if (auto st = Connect(channel.get(), options.target, options.connect_timeout_s); !st.ok()) {
    return st;
  }
  auto stub = v1::Generation::NewStub(channel);
  v1::ListModelsResponse models;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status st = stub->ListModels(&context, v1::ListModelsRequest(), &models);
    if (!st.ok()) {
      return absl::UnavailableError(
          absl::StrCat("ListModels on ", options.target, " failed: ", StatusText(st)));
    }
  }
  const v1::ModelInfo* info = nullptr;
  for (const v1::ModelInfo& m : models.models()) {
    if (options.model.empty() || m.name() == options.model) {
      info = &m;
      break;
    }
  }
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat("the server at ", options.target,
                                            " does not serve model '", options.model, "'"));
  }
  WorkloadOptions workload_options = options.workload;
  if (workload_options.vocab_size <= 0) workload_options.vocab_size = info->vocab_size();
  if (workload_options.max_model_len <= 0) workload_options.max_model_len = info->max_model_len();
  if (workload_options.vocab_size < 2) {
    return absl::FailedPreconditionError("the server reports no vocabulary size");
  }
  BenchOptions effective = options;
  effective.workload = workload_options;

  RunDescription run;
  run.label = options.label;
  run.target = options.target;
  run.model = info->name();
  run.vocab_size = workload_options.vocab_size;
  run.max_model_len = static_cast<int32_t>(workload_options.max_model_len);
  run.concurrency = options.concurrency;
  run.request_rate = options.request_rate;
  run.num_requests = options.num_requests;
  run.duration_s = options.duration_s;
  run.prompt_len = workload_options.prompt_len.ToString();
  run.output_len = workload_options.output_len.ToString();
  run.num_prefixes = workload_options.num_prefixes;
  run.prefix_len = workload_options.prefix_len;
  run.cancel_fraction = workload_options.cancel_fraction;
  run.block_size = options.block_size;
  run.warmup_requests = options.warmup_requests;
  run.ignore_eos = options.ignore_eos;
  run.temperature = options.temperature;

  if (options.warmup_requests > 0) {
    WorkloadOptions warm = workload_options;
    warm.seed = workload_options.seed + 1000003;
    warm.cancel_fraction = 0;
    Workload warm_workload(warm);
    Phase warmup(effective, stub.get(), &warm_workload, info->name(), /*warmup=*/true);
    warmup.Run(options.warmup_requests, 0, {}, nullptr, nullptr, nullptr);
  }
  std::vector<std::shared_ptr<grpc::Channel>> stats_channels;
  if (options.stats_targets.empty()) {
    stats_channels.push_back(channel);
  } else {
    for (const std::string& t : options.stats_targets) stats_channels.push_back(MakeChannel(t));
  }
  Workload workload(workload_options);
  Phase phase(effective, stub.get(), &workload, info->name(), /*warmup=*/false);
  std::vector<OccupancySample> samples;
  std::string server_note;
  LoadWindow window;
  std::vector<CallResult> results =
      phase.Run(options.num_requests, options.duration_s, std::move(stats_channels), &samples,
                &server_note, &window);
  return BuildReport(run, results, samples, server_note, window);
}

}  // namespace tandem::bench
