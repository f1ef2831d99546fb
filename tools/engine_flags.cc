#include "tools/engine_flags.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <pthread.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "tools/commands.h"

namespace tandem {

EngineFlags::EngineFlags() : model_dir(DefaultModelDir()) {}

void EngineFlags::Register(FlagSet* f) {
  f->String("model", &model_dir, "Hugging Face model directory");
  f->String("dtype", &dtype, "weight dtype in memory: auto, f32 or bf16");
  f->String("kv-cache-dtype", &kv_dtype,
            "KV cache dtype: auto, f32, bf16, fp8 (e4m3) or int8 (fp8/int8: a scale per token and "
            "kv head; cpu only)");
  f->String("quantization", &quantization,
            "weight-only quantization made at load time: none, int8 (per-channel) or int4 "
            "(groups with zero points); cpu only. AWQ / GPTQ int4 checkpoints are detected from "
            "config.json and load as int4 by themselves (keep none)");
  f->Int("quantization-group-size", &quant_group_size,
         "int4: weights per scale/zero group along the input dimension (32, 64, 128, ...)");
  f->Bool("mmap-weights", &mmap_weights,
          "cpu: use weights stored in their in-memory dtype straight from the checkpoint's file "
          "mapping (less memory, 4 KiB page-cache pages) instead of copying them into huge-page "
          "memory at load (faster decode); bf16 projections that take bf16 inputs on "
          "AVX512_BF16 are rearranged into tiles at load either way");
  f->String("matmul-input-dtype", &matmul_input_dtype,
            "cpu: what the matrix products' inputs are rounded to: auto (int8 for int8 and "
            "int4 weights on CPUs with AVX512_VNNI, bf16 for bf16 weights (and quantized ones "
            "without VNNI) on CPUs with AVX512_BF16, else f32), f32 (exact) or bf16 (bf16 dot "
            "products, vdpbf16ps on AVX512_BF16; quantized weights dequantized to bf16; not "
            "with f32 weights) or int8 (int8 / int4 weights only: each input row quantized to "
            "int8 with one scale, integer dot products, vpdpbusd on AVX512_VNNI)");
  f->String("kv-cache-memory", &kv_memory,
            "KV pool budget, e.g. 512MiB or 4GiB (cpu: the whole pool is committed at startup)");
  f->Int("num-kv-blocks", &num_kv_blocks, "KV pool size in blocks (overrides the budget)");
  f->Int("block-size", &block_size, "tokens per KV block");
  f->Int("max-num-seqs", &max_num_seqs, "sequences per step at most");
  f->Int("max-num-batched-tokens", &max_batched_tokens, "tokens per step at most");
  f->Int("max-prefill-chunk", &max_prefill_chunk, "tokens of one prompt per step (0: budget)");
  f->Int("max-model-len", &max_model_len, "context length (0: the model's)");
  f->Int("max-waiting", &max_waiting, "queued sequences before RESOURCE_EXHAUSTED");
  f->String("scheduling-policy", &policy,
            "fcfs, priority, static or static-compact (the last two: benchmark baselines)");
  f->Bool("no-prefix-cache", &no_prefix_cache, "disable prefix caching");
  f->Int("threads", &threads, "compute threads (0: one per core)");
  f->String("device", &device, "cpu, cuda, cuda:N or auto (cuda when a GPU is visible)");
  f->Double("gpu-memory-utilization", &gpu_memory_utilization,
            "cuda: fraction of device memory for weights, activations and the KV pool");
  f->String("speculative-method", &speculative_method, "none, ngram or draft");
  f->Int("num-speculative-tokens", &num_speculative_tokens, "drafted tokens per step at most");
  f->String("draft-model", &draft_model, "draft model directory (speculative method draft)");
  f->Int("ngram-max", &ngram_max, "ngram: longest suffix to match");
  f->Int("ngram-min", &ngram_min, "ngram: shortest suffix to match");
  f->Bool("no-adaptive-speculation", &no_adaptive_speculation,
          "keep k fixed instead of adapting it to each sequence's acceptance");
}

absl::StatusOr<EngineBuildOptions> EngineFlags::ToBuildOptions() const {
  EngineBuildOptions o;
  o.model_dir = model_dir;
  o.weight_dtype = dtype;
  o.kv_cache_dtype = kv_dtype;
  o.quantization = quantization;
  o.quant_group_size = quant_group_size;
  o.matmul_input_dtype = matmul_input_dtype;
  o.mmap_weights = mmap_weights;
  auto bytes = ParseByteSize(kv_memory);
  if (!bytes.ok()) return bytes.status();
  o.kv_cache_bytes = *bytes;
  o.num_kv_blocks = num_kv_blocks;
  o.block_size = block_size;
  o.threads = static_cast<int>(threads);
  if (policy == "fcfs") {
    o.engine.scheduler.policy = SchedulingPolicy::kFcfs;
  } else if (policy == "priority") {
    o.engine.scheduler.policy = SchedulingPolicy::kPriority;
  } else if (policy == "static") {
    o.engine.scheduler.baseline = BatchingBaseline::kStatic;
  } else if (policy == "static-compact") {
    o.engine.scheduler.baseline = BatchingBaseline::kStaticCompact;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--scheduling-policy must be fcfs, priority, static or static-compact, got '",
                     policy, "'"));
  }
  o.engine.scheduler.max_num_seqs = max_num_seqs;
  o.engine.scheduler.max_num_batched_tokens = max_batched_tokens;
  o.engine.scheduler.max_prefill_chunk = max_prefill_chunk;
  o.engine.enable_prefix_cache = !no_prefix_cache;
  o.engine.max_model_len = max_model_len;
  o.engine.max_waiting = max_waiting;
  o.device = device;
  o.gpu_memory_utilization = gpu_memory_utilization;
  SpecOptions& spec = o.engine.spec;
  if (speculative_method == "none") {
    spec.method = SpecOptions::Method::kNone;
  } else if (speculative_method == "ngram") {
    spec.method = SpecOptions::Method::kNgram;
  } else if (speculative_method == "draft") {
    spec.method = SpecOptions::Method::kDraft;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative-method must be none, ngram or draft, got '", speculative_method, "'"));
  }
  spec.num_speculative_tokens = static_cast<int32_t>(num_speculative_tokens);
  spec.draft_model_dir = draft_model;
  spec.ngram_max = static_cast<int32_t>(ngram_max);
  spec.ngram_min = static_cast<int32_t>(ngram_min);
  spec.adaptive = !no_adaptive_speculation;
  return o;
}

std::vector<std::string> EngineFlags::ToArgs() const {
  std::vector<std::string> a = {
      "--model=" + model_dir,
      "--dtype=" + dtype,
      "--kv-cache-dtype=" + kv_dtype,
      "--quantization=" + quantization,
      absl::StrCat("--quantization-group-size=", quant_group_size),
      "--matmul-input-dtype=" + matmul_input_dtype,
      "--kv-cache-memory=" + kv_memory,
      absl::StrCat("--num-kv-blocks=", num_kv_blocks),
      absl::StrCat("--block-size=", block_size),
      absl::StrCat("--max-num-seqs=", max_num_seqs),
      absl::StrCat("--max-num-batched-tokens=", max_batched_tokens),
      absl::StrCat("--max-prefill-chunk=", max_prefill_chunk),
      absl::StrCat("--max-model-len=", max_model_len),
      absl::StrCat("--max-waiting=", max_waiting),
      "--scheduling-policy=" + policy,
      absl::StrCat("--threads=", threads),
      "--device=" + device,
      absl::StrCat("--gpu-memory-utilization=", gpu_memory_utilization),
      "--speculative-method=" + speculative_method,
      absl::StrCat("--num-speculative-tokens=", num_speculative_tokens),
      "--draft-model=" + draft_model,
      absl::StrCat("--ngram-max=", ngram_max),
      absl::StrCat("--ngram-min=", ngram_min),
  };
  if (no_adaptive_speculation) a.push_back("--no-adaptive-speculation");
  if (no_prefix_cache) a.push_back("--no-prefix-cache");
  if (mmap_weights) a.push_back("--mmap-weights");
  return a;
}

void ServerFlags::Register(FlagSet* f, int64_t default_port) {
  port = default_port;
  f->String("host", &host, "address to listen on");
  f->Int("port", &port, "port to listen on (0: any free port)");
  f->String("port-file", &port_file, "write the bound port to this file once serving");
  f->Double("drain-timeout", &drain_timeout_s, "seconds to let requests finish on SIGTERM");
  f->Bool("log-json", &log_json, "log one JSON object per line");
  RegisterMetricsFlags(f, &metrics);
  f->String("tls-cert", &tls_cert, "PEM certificate (chain): TLS on the gRPC and HTTP listeners");
  f->String("tls-key", &tls_key, "PEM private key of --tls-cert");
  f->String("tls-ca", &tls_ca, "PEM CA certificates that peers' certificates must chain to");
  f->Bool("tls-client-auth", &tls_client_auth,
          "mTLS: refuse clients without a certificate signed by --tls-ca");
}

MetricsOptions ServerFlags::Metrics() const {
  MetricsOptions m = metrics;
  m.tls.cert = tls_cert;
  m.tls.key = tls_key;
  if (tls_client_auth) m.tls.client_ca = tls_ca;
  return m;
}

std::vector<std::string> ServerFlags::TlsArgs() const {
  std::vector<std::string> a;
  if (!tls_cert.empty()) a.push_back("--tls-cert=" + tls_cert);
  if (!tls_key.empty()) a.push_back("--tls-key=" + tls_key);
  if (!tls_ca.empty()) a.push_back("--tls-ca=" + tls_ca);
  if (tls_client_auth) a.push_back("--tls-client-auth");
  return a;
}

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(flag, ": cannot read ", path));
  std::stringstream s;
  s << in.rdbuf();
  if (s.str().find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, " is not PEM"));
  }
  return s.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerFlags& flags) {
  if (flags.tls_cert.empty()) {
    if (!flags.tls_key.empty() || flags.tls_client_auth) {
      return absl::InvalidArgumentError("--tls-key and --tls-client-auth need --tls-cert");
    }
    return grpc::InsecureServerCredentials();
  }
  auto cert = ReadPem(flags.tls_cert, "--tls-cert");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(flags.tls_key, "--tls-key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions o(
      flags.tls_client_auth ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                            : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (flags.tls_client_auth) {
    if (flags.tls_ca.empty()) return absl::InvalidArgumentError("--tls-client-auth needs --tls-ca");
    auto ca = ReadPem(flags.tls_ca, "--tls-ca");
    if (!ca.ok()) return ca.status();
    o.pem_root_certs = *ca;
  }
  o.pem_key_cert_pairs.push_back({*key, *cert});
  return grpc::SslServerCredentials(o);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ServerFlags& flags) {
  if (flags.tls_ca.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  auto ca = ReadPem(flags.tls_ca, "--tls-ca");
  if (!ca.ok()) return ca.status();
  o.pem_root_certs = *ca;
  if (!flags.tls_cert.empty()) {
    auto cert = ReadPem(flags.tls_cert, "--tls-cert");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(flags.tls_key, "--tls-key");
    if (!key.ok()) return key.status();
    o.pem_cert_chain = *cert;
    o.pem_private_key = *key;
  }
  return grpc::SslCredentials(o);
}

sigset_t BlockTerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  // SIGHUP too (it reloads the API keys, tools/http_api.h), but it is not a termination signal.
  sigset_t blocked = signals;
  sigaddset(&blocked, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
  return signals;
}

int WaitForTerminationSignal(const sigset_t& signals) {
  int sig = 0;
  while (sigwait(&signals, &sig) != 0) {
  }
  return sig;
}

void WriteFileAtomically(const std::string& path, const std::string& content) {
  std::ofstream(path + ".tmp") << content;
  std::error_code ec;
  std::filesystem::rename(path + ".tmp", path, ec);
}

absl::StatusOr<RunningServer> StartGrpcServer(const ServerFlags& flags,
                                              const std::vector<grpc::Service*>& services) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  auto credentials = MakeServerCredentials(flags);
  if (!credentials.ok()) return credentials.status();
  grpc::ServerBuilder builder;
  RunningServer running;
  builder.AddListeningPort(absl::StrCat(flags.host, ":", flags.port), *credentials, &running.port);
  builder.SetMaxReceiveMessageSize(64 << 20);
  for (grpc::Service* s : services) builder.RegisterService(s);
  running.server = builder.BuildAndStart();
  if (running.server == nullptr || running.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", flags.host, ":", flags.port));
  }
  running.server->GetHealthCheckService()->SetServingStatus(true);
  if (!flags.port_file.empty())
    WriteFileAtomically(flags.port_file, absl::StrCat(running.port, "\n"));
  return running;
}

}  // namespace tandem
