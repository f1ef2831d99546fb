// `tandem serve`: the router front and one worker in role `both`, in one process.

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/base/flags.h"
#include "common/base/log.h"
#include "common/engine/async_engine.h"
#include "common/engine/engine_builder.h"
#include "common/engine/tokenizer/tokenizer.h"
#include "decode_worker/worker_core.h"
#include "decode_worker/worker_service.h"
#include "router/generation_service.h"
#include "tools/commands.h"

namespace tandem {
namespace {

// Routes the router's requests to the worker core in this process.
class LocalClient : public InferenceClient {
 public:
  explicit LocalClient(WorkerCore* core) : core_(core) {}
  void Decode(const v1::DecodeRequest& request, ResponseCallback callback) override {
    core_->Decode(request, std::move(callback));
  }
  void Cancel(const std::string& request_id, int32_t index) override {
    core_->Cancel(request_id, index);
  }

 private:
  WorkerCore* core_;
};

absl::StatusOr<SchedulingPolicy> ParsePolicy(const std::string& name) {
  if (name == "fcfs") return SchedulingPolicy::kFcfs;
  if (name == "priority") return SchedulingPolicy::kPriority;
  if (name == "static") return SchedulingPolicy::kStatic;
  return absl::InvalidArgumentError(
      absl::StrCat("--scheduling-policy must be fcfs, priority or static, got '", name, "'"));
}

}  // namespace

int RunServe(int argc, char** argv) {
  // Signals are taken synchronously by this thread (sigwait); block them before any thread
  // starts so that every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::string model_dir = DefaultModelDir(), host = "127.0.0.1", dtype = "auto", kv_dtype = "auto",
              kv_memory = "1GiB", policy = "fcfs", model_name, port_file;
  int64_t port = 50051, threads = 0, block_size = 16, max_num_seqs = 64, max_batched_tokens = 512,
          max_model_len = 0, max_waiting = 4096, max_prefill_chunk = 0, num_kv_blocks = 0;
  double drain_timeout_s = 60;
  bool no_prefix_cache = false, log_json = false;
  FlagSet flags("serve", "Serves the Generation gRPC API (router and one worker in one process).");
  flags.String("model", &model_dir, "Hugging Face model directory");
  flags.String("model-name", &model_name, "name clients use (default: the directory's name)");
  flags.String("host", &host, "address to listen on");
  flags.Int("port", &port, "port to listen on (0: any free port)");
  flags.String("port-file", &port_file, "write the bound port to this file once serving");
  flags.String("dtype", &dtype, "weight dtype in memory: auto, f32 or bf16");
  flags.String("kv-cache-dtype", &kv_dtype, "KV cache dtype: auto, f32 or bf16");
  flags.String("kv-cache-memory", &kv_memory, "KV pool budget, e.g. 512MiB or 4GiB");
  flags.Int("num-kv-blocks", &num_kv_blocks, "KV pool size in blocks (overrides the budget)");
  flags.Int("block-size", &block_size, "tokens per KV block");
  flags.Int("max-num-seqs", &max_num_seqs, "sequences per step at most");
  flags.Int("max-num-batched-tokens", &max_batched_tokens, "tokens per step at most");
  flags.Int("max-prefill-chunk", &max_prefill_chunk, "tokens of one prompt per step (0: budget)");
  flags.Int("max-model-len", &max_model_len, "context length (0: the model's)");
  flags.Int("max-waiting", &max_waiting, "queued sequences before RESOURCE_EXHAUSTED");
  flags.String("scheduling-policy", &policy, "fcfs, priority or static (benchmark baseline)");
  flags.Bool("no-prefix-cache", &no_prefix_cache, "disable prefix caching");
  flags.Int("threads", &threads, "compute threads (0: one per core)");
  flags.Double("drain-timeout", &drain_timeout_s, "seconds to let requests finish on SIGTERM");
  flags.Bool("log-json", &log_json, "log one JSON object per line");
  if (auto st = flags.Parse(argc, argv); !st.ok()) {
    std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return 2;
  }
  if (flags.help_requested()) return 0;
  ConfigureLogging({LogLevel::kInfo, log_json, "serve"});

  auto sched_policy = ParsePolicy(policy);
  auto kv_bytes = ParseByteSize(kv_memory);
  if (!sched_policy.ok() || !kv_bytes.ok()) {
    std::fprintf(
        stderr, "serve: %s\n",
        std::string((!sched_policy.ok() ? sched_policy.status() : kv_bytes.status()).message())
            .c_str());
    return 2;
  }
  auto tokenizer = Tokenizer::FromModelDir(model_dir);
  if (!tokenizer.ok()) {
    TLOG(ERROR) << tokenizer.status();
    return 1;
  }
  EngineBuildOptions options;
  options.model_dir = model_dir;
  options.weight_dtype = dtype;
  options.kv_cache_dtype = kv_dtype;
  options.kv_cache_bytes = *kv_bytes;
  options.num_kv_blocks = num_kv_blocks;
  options.block_size = block_size;
  options.threads = static_cast<int>(threads);
  options.engine.scheduler.policy = *sched_policy;
  options.engine.scheduler.max_num_seqs = max_num_seqs;
  options.engine.scheduler.max_num_batched_tokens = max_batched_tokens;
  options.engine.scheduler.max_prefill_chunk = max_prefill_chunk;
  options.engine.enable_prefix_cache = !no_prefix_cache;
  options.engine.max_model_len = max_model_len;
  options.engine.max_waiting = max_waiting;
  auto built = BuildEngine(options);
  if (!built.ok()) {
    TLOG(ERROR) << built.status();
    return 1;
  }
  const ModelConfig& config = built->model->config();
  const int64_t context = built->engine->max_model_len();
  AsyncEngine engine(std::move(built->engine));
  WorkerCore core(&engine);
  LocalClient client(&core);

  GenerationServiceOptions service_options;
  service_options.model_name =
      !model_name.empty() ? model_name : std::filesystem::path(model_dir).filename().string();
  if (service_options.model_name.empty()) service_options.model_name = "default";
  service_options.architecture = config.architecture_name;
  service_options.max_model_len = static_cast<int32_t>(context);
  service_options.dtype = std::string(DTypeName(built->model->weight_dtype()));
  GenerationService service(service_options, tokenizer->get(), &client);
  WorkerService worker_service(&core);  // stats and direct worker access on the same port

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(absl::StrCat(host, ":", port), grpc::InsecureServerCredentials(),
                           &bound_port);
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.RegisterService(&service);
  builder.RegisterService(&worker_service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    TLOG(ERROR) << "cannot listen on " << host << ":" << port;
    return 1;
  }
  server->GetHealthCheckService()->SetServingStatus(true);
  TLOG(INFO) << "serving model '" << service_options.model_name << "' on " << host << ":"
             << bound_port;
  if (!port_file.empty()) {
    std::ofstream(port_file + ".tmp") << bound_port << "\n";
    std::filesystem::rename(port_file + ".tmp", port_file);
  }

  int sig = 0;
  sigwait(&signals, &sig);
  TLOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ", draining "
             << service.active_calls() << " streams";
  service.StartDrain();
  worker_service.StartDrain();
  server->GetHealthCheckService()->SetServingStatus(false);
  absl::Time deadline = absl::Now() + absl::Seconds(drain_timeout_s);
  while ((service.active_calls() > 0 || worker_service.active_calls() > 0) &&
         absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (service.active_calls() > 0) {
    TLOG(WARNING) << "drain timeout: aborting " << service.active_calls() << " streams";
  }
  engine.Shutdown();  // aborts whatever is left; their streams end
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  TLOG(INFO) << "stopped";
  return 0;
}

}  // namespace tandem
