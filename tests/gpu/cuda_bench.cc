// GPU benchmark of the CUDA backend on a random Llama-3.2-1B-shaped bf16 model (written once to
// <build>/gpu_test_models/llama-1b-bf16, shared with cuda_backend_test): decode steps by batch
// size (CUDA graphs and eager, bf16 activations and the f32 parity mode), speculative
// verification and mixed prefill + decode steps, chunked prefill, long-context decode, and
// decode / prefill over int8, int4 and fp8 weights quantized at load.
// --only fp8-gemm: only fp8 weights (quantized at load), prefill chunks of 512 and 2048 tokens and
// a batch-32 decode step on the weight-only path (fp8_gemm off: dequantized tiles + cuBLAS bf16)
// beside the FP8 tensor-core GEMM (on: per-token e4m3 activations, cuBLASLt), one backend at a
// time (tests/gpu/check.sh fp8gemm).
//
// Every figure is set beside the card's limits measured first: the device-to-device copy
// bandwidth (bytes read + written per second) and the bf16 matrix peak (an 8192^3 cuBLAS bf16
// GEMM on random data). A step's bytes are what it must read and write: every weight matrix of
// the layers and the lm_head once, the embedding rows of its tokens (not the table), the KV
// cache of its contexts and the KV it writes (activations are left out: under 1% at these
// sizes). Its FLOPs are 2 per weight per token through the layers, 2 per lm_head weight per logit
// row and the attention's 4 per (query, key, head, dim) pair, the embedding lookup none. Each
// row prints "% of limit": the step's bytes / time against the copy bandwidth, and its FLOPs /
// time against the matrix peak.
//
//   cuda_bench [--model DIR] [--steps N] [--only fp8-gemm]
// Exits 0 without a GPU (printing why).

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/engine/backend/cuda/cuda_backend_impl.h"
#include "common/engine/model/model_writer.h"
#include "tests/util/test_paths.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

struct Limits {
  double bandwidth = 0;   // bytes/s, device-to-device copy (read + write)
  double bf16_flops = 0;  // FLOP/s, cuBLAS bf16 GEMM
};

// Device-to-device bandwidth and bf16 matrix peak, timed with events (best of the timed runs).
bool MeasureLimits(Limits* limits) {
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return false;
  cudaMemset(a, 1, bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  float best = 1e30f;
  for (int i = 0; i < 8; ++i) {
    cudaEventRecord(start);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i >= 2) best = std::min(best, ms);
  }
  limits->bandwidth = 2.0 * static_cast<double>(bytes) / (best / 1e3);
  cudaFree(a);
  cudaFree(b);

  const int n = 8192;
  const size_t elems = static_cast<size_t>(n) * n;
  std::vector<uint16_t> host(elems);
  uint32_t state = 12345;
  for (auto& h : host) {  // bf16 values in about [-1, 1] (random: zeros run faster)
    state = state * 1664525u + 1013904223u;
    h = static_cast<uint16_t>(0x3c00u + (state >> 22) % 0x300u) | ((state >> 8) & 0x8000u);
  }
  void *x = nullptr, *w = nullptr, *y = nullptr;
  if (cudaMalloc(&x, elems * 2) != cudaSuccess || cudaMalloc(&w, elems * 2) != cudaSuccess ||
      cudaMalloc(&y, elems * 2) != cudaSuccess) {
    return false;
  }
  cudaMemcpy(x, host.data(), elems * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(w, host.data(), elems * 2, cudaMemcpyHostToDevice);
  cublasHandle_t handle = nullptr;
  cublasCreate(&handle);
  const float alpha = 1, beta = 0;
  best = 1e30f;
  for (int i = 0; i < 8; ++i) {
    cudaEventRecord(start);
    cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, w, CUDA_R_16BF, n, x,
                 CUDA_R_16BF, n, &beta, y, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i >= 2) best = std::min(best, ms);
  }
  limits->bf16_flops = 2.0 * n * static_cast<double>(n) * n / (best / 1e3);
  cublasDestroy(handle);
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return cudaGetLastError() == cudaSuccess;
}

// What a step must move and compute (see the file comment).
struct Work {
  double bytes = 0;
  double flops = 0;
};

class Accounting {
 public:
  explicit Accounting(const Model& model, size_t kv_bytes_per_token_layer)
      : c_(model.config()), kv_token_layer_(static_cast<double>(kv_bytes_per_token_layer)) {
    const double d = c_.hidden_size, f = c_.intermediate_size;
    const double qd = c_.num_heads * c_.head_dim, kvd = c_.num_kv_heads * c_.head_dim;
    const double elem = DTypeSize(model.weight_dtype());
    layer_params_ = c_.num_layers * (d * (qd + 2 * kvd) + qd * d + 2 * d * f + f * d);
    head_params_ = static_cast<double>(c_.vocab_size) * d;
    // Quantized weights: the codes, scales and zeros a step reads.
    weight_bytes_ = model.quantization() != WeightQuant::kNone
                        ? static_cast<double>(model.decode_weight_bytes())
                        : (layer_params_ + head_params_) * elem;
    row_bytes_ = d * elem;
  }

  // `contexts[i]`: keys token i attends to (its position + 1); `logit_rows` rows of logits.
  Work Step(const std::vector<int>& contexts, int logit_rows) const {
    Work w;
    const double tokens = static_cast<double>(contexts.size());
    double keys = 0;
    for (int ctx : contexts) keys += ctx;
    const double qd = c_.num_heads * c_.head_dim;
    // KV written here; the KV read (each sequence's cache once per step) is added by KvRead.
    w.bytes = weight_bytes_ + tokens * row_bytes_ + kv_token_layer_ * c_.num_layers * tokens;
    w.flops =
        2 * layer_params_ * tokens + 2 * head_params_ * logit_rows + 4 * keys * qd * c_.num_layers;
    return w;
  }
  // The KV a set of sequences reads once (their final context lengths).
  double KvRead(const std::vector<int>& seq_contexts) const {
    double keys = 0;
    for (int ctx : seq_contexts) keys += ctx;
    return kv_token_layer_ * c_.num_layers * keys;
  }
  double weight_bytes() const { return weight_bytes_; }

 private:
  const ModelConfig& c_;
  double kv_token_layer_;
  double layer_params_ = 0, head_params_ = 0, weight_bytes_ = 0, row_bytes_ = 0;
};

struct Row {
  std::string what;
  double ms = 0;
  double tokens = 0;
  Work work;
  std::string note;
};

// Sequence i of `batch` owns blocks [i * per_seq, (i + 1) * per_seq) for `context` positions.
std::vector<int32_t> Table(int i, int context) {
  const int per_seq = (context + 15) / 16;
  std::vector<int32_t> table(per_seq);
  for (int k = 0; k < per_seq; ++k) table[k] = i * per_seq + k;
  return table;
}

// `batch` sequences each decoding `tokens` tokens (all their logits when tokens > 1, as a
// speculative verification) at positions context - tokens .. context - 1.
ForwardBatch DecodeBatch(int batch, int context, int tokens, std::mt19937& rng) {
  ForwardBatch b;
  for (int i = 0; i < batch; ++i) {
    std::vector<int32_t> ids(tokens);
    for (auto& t : ids) t = static_cast<int32_t>(3 + rng() % 31000);
    b.AddSequenceRows(ids, context - tokens, Table(i, context), 16, tokens);
  }
  return b;
}

double TimeSteps(Backend& backend, const ForwardBatch& batch, int steps) {
  std::vector<float> logits(batch.logit_rows.size() * backend.vocab_size());
  for (int i = 0; i < 3; ++i) {  // warm-up (cuBLAS heuristics, caches)
    absl::Status st = backend.Forward(batch, logits.data());
    if (!st.ok()) {
      std::fprintf(stderr, "forward failed: %s\n", st.ToString().c_str());
      std::exit(1);
    }
  }
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) {
    if (!backend.Forward(batch, logits.data()).ok()) std::exit(1);
  }
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count() / steps;
}

// One sequence's prefill chunk of `chunk` tokens at position 0 (its last logit row), and what it
// must move and compute.
ForwardBatch PrefillBatch(int chunk, std::mt19937& rng) {
  ForwardBatch b;
  std::vector<int32_t> tokens(chunk);
  for (auto& t : tokens) t = static_cast<int32_t>(3 + rng() % 31000);
  b.AddSequence(tokens, 0, Table(0, chunk), 16, true);
  return b;
}
Work PrefillWork(const Accounting& a, int chunk) {
  std::vector<int> contexts;
  for (int i = 1; i <= chunk; ++i) contexts.push_back(i);
  Work w = a.Step(contexts, 1);
  w.bytes += a.KvRead({chunk});  // the chunk's own keys, once
  return w;
}

void PrintRows(const std::vector<Row>& rows, const Limits& limits) {
  std::printf("limits: device-to-device copy %.0f GB/s, bf16 matrix peak %.0f TFLOP/s\n",
              limits.bandwidth / 1e9, limits.bf16_flops / 1e12);
  std::printf("%-36s %9s %10s %9s %9s %9s %9s\n", "case", "ms/step", "tokens/s", "GB/s", "%bw",
              "TFLOP/s", "%peak");
  for (const Row& r : rows) {
    const double s = r.ms / 1e3;
    const double gbs = r.work.bytes / s / 1e9, tfs = r.work.flops / s / 1e12;
    std::printf("%-36s %9.3f %10.0f %9.0f %8.1f%% %9.1f %8.1f%%  %s\n", r.what.c_str(), r.ms,
                r.tokens / s, gbs, 100 * r.work.bytes / s / limits.bandwidth, tfs,
                100 * r.work.flops / s / limits.bf16_flops, r.note.c_str());
  }
}

// --only fp8-gemm (see the file comment).
int Fp8GemmComparison(const std::string& model_dir, const LoadOptions& load,
                      const CudaBackendOptions& options, int steps, const Limits& limits) {
  LoadOptions ql = load;
  ql.quantization = WeightQuant::kFp8;
  ql.quant_layout = WeightLayout::kRows;
  const auto load_start = Clock::now();
  auto loaded = LoadModel(model_dir, ql);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
    return 1;
  }
  std::shared_ptr<const Model> model = std::move(loaded).value();
  std::printf("fp8 model quantized at load in %.1f s\n",
              std::chrono::duration<double>(Clock::now() - load_start).count());
  std::vector<Row> rows;
  std::vector<double> ms[2];
  for (Fp8GemmMode mode : {Fp8GemmMode::kOff, Fp8GemmMode::kOn}) {
    const bool on = mode == Fp8GemmMode::kOn;
    CudaBackendOptions o = options;
    o.fp8_gemm = mode;
    auto created = cuda::CudaBackend::Create(model, o);
    if (!created.ok()) {
      std::fprintf(stderr, "backend (fp8_gemm %s): %s\n", on ? "on" : "off",
                   created.status().ToString().c_str());
      return 1;
    }
    std::unique_ptr<cuda::CudaBackend> b = std::move(created).value();
    const Accounting a(*model, b->kv_spec().bytes_per_block_layer() /
                                   static_cast<size_t>(b->kv_spec().block_size));
    const std::string name = on ? " fp8 FP8 GEMM" : " fp8 weight-only";
    std::mt19937 rng(1);
    const ForwardBatch decode = DecodeBatch(32, 512, 1, rng);
    Work dw = a.Step(std::vector<int>(32, 512), 32);
    dw.bytes += a.KvRead(std::vector<int>(32, 512));
    ms[on].push_back(TimeSteps(*b, decode, steps));
    rows.push_back({"decode b=32 ctx=512" + name, ms[on].back(), 32, dw, ""});
    for (int chunk : {512, 2048}) {
      const ForwardBatch p = PrefillBatch(chunk, rng);
      ms[on].push_back(TimeSteps(*b, p, std::max(3, steps / 4)));
      rows.push_back({"prefill chunk=" + std::to_string(chunk) + name, ms[on].back(), 1.0 * chunk,
                      PrefillWork(a, chunk), ""});
    }
    std::printf("fp8_gemm %s: %lld products on the FP8 GEMM\n", on ? "on" : "off",
                static_cast<long long>(b->gemm().fp8_calls()));
    if (on && b->gemm().fp8_calls() == 0) {
      std::fprintf(stderr, "fp8_gemm on ran no FP8 GEMM\n");
      return 1;
    }
  }
  std::printf(
      "\ncuda_bench fp8-gemm: %s, llama-1b fp8 (weights quantized at load), bf16 KV, "
      "bf16 activations, CUDA graphs up to 512 tokens\n",
      CudaDeviceDescription(0).c_str());
  PrintRows(rows, limits);
  const char* cases[] = {"decode b=32", "prefill 512", "prefill 2048"};
  for (int i = 0; i < 3; ++i) {
    std::printf("%s: weight-only %.3f ms, FP8 GEMM %.3f ms, speedup %.2fx\n", cases[i], ms[0][i],
                ms[1][i], ms[0][i] / ms[1][i]);
  }
  std::printf("(%%peak: of the bf16 matrix peak; the FP8 tensor-core peak is twice it)\n");
  return 0;
}

int Main(int argc, char** argv) {
  std::string model_dir = tandem::TestBinaryDir() + "/gpu_test_models/llama-1b-bf16";
  int steps = 20;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--model") == 0) model_dir = argv[i + 1];
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--only") == 0) only = argv[i + 1];
  }
  if (!only.empty() && only != "fp8-gemm") {
    std::fprintf(stderr, "cuda_bench: --only takes fp8-gemm, got %s\n", only.c_str());
    return 1;
  }
  std::string why;
  if (!CudaDeviceAvailable(&why)) {
    std::printf("cuda_bench: skipped: %s\n", why.c_str());
    return 0;
  }
  Limits limits;
  if (!MeasureLimits(&limits)) {
    std::fprintf(stderr, "cuda_bench: measuring the limits failed\n");
    return 1;
  }
  if (!std::filesystem::exists(model_dir + "/config.json")) {
    RandomModelOptions random;
    random.preset = "llama-1b";
    random.dtype = DType::kBF16;
    random.seed = 1;
    if (auto st = WriteRandomModel(random, model_dir); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
  }
  LoadOptions load;
  load.weight_dtype_auto = false;
  load.weight_dtype = DType::kBF16;
  auto loaded = LoadModel(model_dir, load);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
    return 1;
  }
  std::shared_ptr<const Model> model = std::move(loaded).value();

  CudaBackendOptions options;
  options.kv_dtype = DType::kBF16;
  options.num_blocks = 20000;  // 32 sequences x 8192 positions, ~10 GiB
  options.max_num_tokens = 2048;
  if (only == "fp8-gemm") return Fp8GemmComparison(model_dir, load, options, steps, limits);
  auto create = [&](bool graphs, bool bf16, DType kv = DType::kBF16) {
    CudaBackendOptions o = options;
    o.cuda_graphs = graphs;
    o.bf16_activations = bf16;
    o.kv_dtype = kv;
    const auto start = Clock::now();
    auto backend = cuda::CudaBackend::Create(model, o);
    if (!backend.ok()) {
      std::fprintf(stderr, "backend: %s\n", backend.status().ToString().c_str());
      std::exit(1);
    }
    std::printf("backend (graphs %s, %s activations, %s KV) created in %.1f s, %lld graphs\n",
                graphs ? "on" : "off", bf16 ? "bf16" : "f32", std::string(DTypeName(kv)).c_str(),
                std::chrono::duration<double>(Clock::now() - start).count(),
                static_cast<long long>((*backend)->graphs_captured()));
    return std::move(backend).value();
  };
  std::unique_ptr<cuda::CudaBackend> fast = create(true, true);
  const Accounting acct(*model, fast->kv_spec().bytes_per_block_layer() /
                                    static_cast<size_t>(fast->kv_spec().block_size));
  std::mt19937 rng(1);
  std::vector<Row> rows;
  auto add = [&](const std::string& what, double ms, int tokens, Work work,
                 const std::string& note = "") {
    rows.push_back({what, ms, static_cast<double>(tokens), work, note});
  };
  auto decode_work_of = [&](const Accounting& a, int batch, int context, int tokens) {
    std::vector<int> contexts;
    for (int i = 0; i < batch; ++i) {
      for (int t = tokens; t >= 1; --t) contexts.push_back(context - t + 1);
    }
    Work w = a.Step(contexts, batch * tokens);
    w.bytes += a.KvRead(std::vector<int>(batch, context));
    return w;
  };
  auto decode_work = [&](int batch, int context, int tokens) {
    return decode_work_of(acct, batch, context, tokens);
  };

  for (int batch : {1, 8, 32, 64, 128, 256}) {
    const ForwardBatch b = DecodeBatch(batch, 512, 1, rng);
    add("decode b=" + std::to_string(batch) + " ctx=512", TimeSteps(*fast, b, steps), batch,
        decode_work(batch, 512, 1));
  }
  {
    const ForwardBatch b = DecodeBatch(32, 8192, 1, rng);
    add("decode b=32 ctx=8192", TimeSteps(*fast, b, steps), 32, decode_work(32, 8192, 1));
    // The same step over the fp8 KV cache (half the KV bytes; its own backend for the time of
    // this row).
    std::unique_ptr<cuda::CudaBackend> fp8 = create(true, true, DType::kF8E4M3);
    const Accounting acct8(*model, fp8->kv_spec().bytes_per_block_layer() /
                                       static_cast<size_t>(fp8->kv_spec().block_size));
    add("decode b=32 ctx=8192 fp8 KV", TimeSteps(*fp8, b, steps), 32,
        decode_work_of(acct8, 32, 8192, 1));
    fp8.reset();
    const ForwardBatch v = DecodeBatch(16, 1024, 4, rng);
    add("verify 16 seqs x 4 tokens ctx=1024", TimeSteps(*fast, v, steps), 64,
        decode_work(16, 1024, 4));
  }
  {  // 32 decoding sequences beside a 256-token prefill chunk (position 0) of another
    ForwardBatch b = DecodeBatch(32, 1024, 1, rng);
    std::vector<int32_t> chunk(256);
    for (auto& t : chunk) t = static_cast<int32_t>(3 + rng() % 31000);
    b.AddSequence(chunk, 0, Table(40, 256), 16, true);
    Work w = decode_work(32, 1024, 1);
    std::vector<int> contexts;
    for (int i = 1; i <= 256; ++i) contexts.push_back(i);
    const Work c = acct.Step(contexts, 1);
    w.bytes += c.bytes - acct.weight_bytes() + acct.KvRead({256});
    w.flops += c.flops;
    add("mixed 32 decodes + 256 prefill", TimeSteps(*fast, b, steps), 32 + 256, w);
  }
  for (int chunk : {512, 2048}) {
    add("prefill chunk=" + std::to_string(chunk),
        TimeSteps(*fast, PrefillBatch(chunk, rng), std::max(3, steps / 4)), chunk,
        PrefillWork(acct, chunk));
  }
  const int64_t graph_steps = fast->graph_steps();
  fast.reset();

  // The same decode steps without graphs, and in the f32 parity mode.
  for (bool graphs : {false, true}) {
    std::unique_ptr<cuda::CudaBackend> other = create(graphs, /*bf16=*/graphs ? false : true);
    for (int batch : {1, 64}) {
      const ForwardBatch b = DecodeBatch(batch, 512, 1, rng);
      add(std::string("decode b=") + std::to_string(batch) +
              (graphs ? " f32 activations" : " eager"),
          TimeSteps(*other, b, steps), batch, decode_work(batch, 512, 1));
    }
  }

  // Weight-only int8, int4 (g128) and fp8 weights quantized at load from the same checkpoint:
  // decode at batch 1 and 8 (the quantized GEMV) and 32 (dequantized tiles + cuBLAS; fp8 on sm_89
  // and above: the FP8 GEMM), and a 512-token prefill chunk. One backend at a time.
  for (WeightQuant quant : {WeightQuant::kInt8, WeightQuant::kInt4, WeightQuant::kFp8}) {
    const std::string name =
        std::string(WeightQuantName(quant)) + (quant == WeightQuant::kInt4 ? " g128" : "");
    LoadOptions ql = load;
    ql.quantization = quant;
    ql.quant_group_size = 128;
    ql.quant_layout = WeightLayout::kRows;
    const auto load_start = Clock::now();
    auto qloaded = LoadModel(model_dir, ql);
    if (!qloaded.ok()) {
      std::fprintf(stderr, "%s\n", qloaded.status().ToString().c_str());
      return 1;
    }
    std::shared_ptr<const Model> qmodel = std::move(qloaded).value();
    std::printf("%s model quantized at load in %.1f s\n", name.c_str(),
                std::chrono::duration<double>(Clock::now() - load_start).count());
    auto created = cuda::CudaBackend::Create(qmodel, options);
    if (!created.ok()) {
      std::fprintf(stderr, "backend (%s): %s\n", name.c_str(), created.status().ToString().c_str());
      return 1;
    }
    std::unique_ptr<cuda::CudaBackend> qb = std::move(created).value();
    const Accounting qa(*qmodel, qb->kv_spec().bytes_per_block_layer() /
                                     static_cast<size_t>(qb->kv_spec().block_size));
    for (int batch : {1, 8, 32}) {
      const ForwardBatch b = DecodeBatch(batch, 512, 1, rng);
      add("decode b=" + std::to_string(batch) + " ctx=512 " + name, TimeSteps(*qb, b, steps), batch,
          decode_work_of(qa, batch, 512, 1));
    }
    add("prefill chunk=512 " + name, TimeSteps(*qb, PrefillBatch(512, rng), std::max(3, steps / 4)),
        512, PrefillWork(qa, 512));
  }

  std::printf(
      "\ncuda_bench: %s, llama-1b bf16 (%.2f GB of matrices), bf16 KV, bf16 activations, "
      "CUDA graphs (%lld graph steps) unless noted\n",
      CudaDeviceDescription(0).c_str(), acct.weight_bytes() / 1e9,
      static_cast<long long>(graph_steps));
  PrintRows(rows, limits);
  std::printf(
      "(bytes: weights %.3f GB (quantized rows: their codes and scales) + embedding rows + KV read "
      "and written; %%bw and %%peak: of the limits above; a step at either limit cannot go "
      "faster)\n",
      acct.weight_bytes() / 1e9);
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
