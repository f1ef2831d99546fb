// GPU benchmark of the CUDA backend on a random Llama-3.2-1B-shaped bf16 model (written once to
// <build>/gpu_test_models/llama-1b-bf16, shared with cuda_backend_test): decode step latency by
// batch size with and without CUDA graphs, chunked-prefill throughput, and long-context decode
// attention. Prints one table; exits 0 without a GPU (printing why).
//
//   cuda_bench [--model DIR] [--steps N]

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/engine/backend/cuda/cuda_backend_impl.h"
#include "common/engine/model/model_writer.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

struct Row {
  std::string what;
  double ms = 0;     // per step
  double rate = 0;   // tokens/s
  std::string note;  // derived figure
};

// A step where `batch` sequences each decode one token at `context - 1`; sequence i owns blocks
// [i * per_seq, (i + 1) * per_seq).
ForwardBatch DecodeBatch(int batch, int context, int block_size, std::mt19937& rng) {
  ForwardBatch b;
  const int per_seq = (context + block_size - 1) / block_size;
  for (int i = 0; i < batch; ++i) {
    std::vector<int32_t> table(per_seq);
    for (int k = 0; k < per_seq; ++k) table[k] = i * per_seq + k;
    b.AddSequence({static_cast<int32_t>(3 + rng() % 31000)}, context - 1, table, block_size, true);
  }
  return b;
}

double TimeSteps(Backend& backend, const ForwardBatch& batch, int steps) {
  std::vector<float> logits(batch.logit_rows.size() * backend.vocab_size());
  for (int i = 0; i < 3; ++i) {  // warm-up (graph capture, cuBLAS heuristics)
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

int Main(int argc, char** argv) {
  std::string model_dir = std::string(TANDEM_BINARY_DIR) + "/gpu_test_models/llama-1b-bf16";
  int steps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--model") == 0) model_dir = argv[i + 1];
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
  }
  std::string why;
  if (!CudaDeviceAvailable(&why)) {
    std::printf("cuda_bench: skipped: %s\n", why.c_str());
    return 0;
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
  options.max_graph_tokens = 256;
  auto graphs = cuda::CudaBackend::Create(model, options);
  options.cuda_graphs = false;
  auto eager = cuda::CudaBackend::Create(model, options);
  if (!graphs.ok() || !eager.ok()) {
    std::fprintf(stderr, "backend: %s\n",
                 (graphs.ok() ? eager.status() : graphs.status()).ToString().c_str());
    return 1;
  }
  const double weight_gb = static_cast<double>((*graphs)->weight_bytes()) / 1e9;
  std::mt19937 rng(1);
  std::vector<Row> rows;

  for (int batch : {1, 8, 32, 64, 128, 256}) {
    const ForwardBatch b = DecodeBatch(batch, 512, 16, rng);
    const double ms = TimeSteps(**graphs, b, steps);
    char note[64];
    std::snprintf(note, sizeof note, "weights %.0f GB/s", weight_gb / (ms / 1e3));
    rows.push_back(
        {"decode graph b=" + std::to_string(batch) + " ctx=512", ms, batch / (ms / 1e3), note});
    if (batch == 1 || batch == 64) {
      const double eager_ms = TimeSteps(**eager, b, steps);
      std::snprintf(note, sizeof note, "graph speedup %.2fx", eager_ms / ms);
      rows.push_back({"decode eager b=" + std::to_string(batch) + " ctx=512", eager_ms,
                      batch / (eager_ms / 1e3), note});
    }
  }

  // Long contexts: decode at 8192 positions, where the KV reads dominate.
  {
    const ForwardBatch b = DecodeBatch(32, 8192, 16, rng);
    const double ms = TimeSteps(**graphs, b, steps);
    const double kv_gb =
        32.0 * 8192 * static_cast<double>((*graphs)->kv_spec().bytes_per_block()) / 16 / 1e9;
    char note[64];
    std::snprintf(note, sizeof note, "KV+weights %.0f GB/s", (kv_gb + weight_gb) / (ms / 1e3));
    rows.push_back({"decode graph b=32 ctx=8192", ms, 32 / (ms / 1e3), note});
  }

  // Chunked prefill: 2048-token chunks of one prompt.
  for (int chunk : {512, 2048}) {
    ForwardBatch b;
    std::vector<int32_t> tokens(chunk), table((chunk + 15) / 16);
    for (auto& t : tokens) t = static_cast<int32_t>(3 + rng() % 31000);
    for (size_t k = 0; k < table.size(); ++k) table[k] = static_cast<int32_t>(k);
    b.AddSequence(tokens, 0, table, 16, true);
    const double ms = TimeSteps(**graphs, b, std::max(3, steps / 4));
    const double params = static_cast<double>((*graphs)->weight_bytes()) / 2;
    char note[64];
    std::snprintf(note, sizeof note, "%.0f TFLOP/s", 2 * params * chunk / (ms / 1e3) / 1e12);
    rows.push_back({"prefill chunk=" + std::to_string(chunk), ms, chunk / (ms / 1e3), note});
  }

  std::printf("\ncuda_bench: %s, llama-1b bf16 (%.2f GB weights), bf16 KV, %s matmuls\n",
              CudaDeviceDescription(0).c_str(), weight_gb, "hi/lo split");
  std::printf("%-30s %10s %12s  %s\n", "case", "ms/step", "tokens/s", "");
  for (const Row& r : rows) {
    std::printf("%-30s %10.3f %12.0f  %s\n", r.what.c_str(), r.ms, r.rate, r.note.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
