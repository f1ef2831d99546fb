// Decode / prefill throughput of the CPU backend for one model and weight format, with the
// machine's memory read bandwidth measured in the same process before every batch-1 decode step,
// so that the fraction of the memory roofline (step bytes / step time / bandwidth) compares like
// with like on a noisy machine. Prints one JSON object (all repetitions) on stdout.
//
//   quant_bench --model DIR [--quantization none|int8|int4] [--group 128] [--kv bf16|fp8|int8]
//               [--threads 0] [--reps 3] [--decode-tokens 32] [--prefill-tokens 512]
//               [--batches 8,16,32] [--batch-steps 8] [--matmul-input f32|bf16|int8]
//               [--mmap-weights] [--bf16-layout auto|rows|tiles]
//   quant_bench --accuracy --model DIR (a model with reference/ logits, e.g. stories260k):
//               top-1 agreement and logits error of none/int8/int4 weights, bf16 weights with
//               f32 or bf16 matmul inputs, and bf16/fp8/int8 KV.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/cpu_features.h"
#include "common/base/flags.h"
#include "common/engine/backend/cpu/cpu_backend.h"
#include "common/engine/backend/cpu/kernels/membw.h"
#include "common/engine/model/model.h"
#include "common/engine/model/quantize.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Sequences with their own blocks from a shared counter, fed to the backend directly.
class Driver {
 public:
  Driver(CpuBackend* backend) : backend_(backend), bs_(backend->kv_spec().block_size) {}

  struct Seq {
    std::vector<int32_t> blocks;
    int32_t len = 0;
  };

  // One step: every sequence appends `tokens[i]` (one chunk each); returns seconds.
  double Step(std::vector<Seq>& seqs, const std::vector<std::vector<int32_t>>& tokens) {
    ForwardBatch batch;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& s = seqs[i];
      const int32_t end = s.len + static_cast<int32_t>(tokens[i].size());
      while (static_cast<int64_t>(s.blocks.size()) * bs_ < end) s.blocks.push_back(next_++);
      batch.AddSequence(tokens[i], s.len, s.blocks, bs_, true);
      s.len = end;
    }
    logits_.resize(batch.logit_rows.size() * backend_->vocab_size());
    const auto t0 = Clock::now();
    absl::Status st = backend_->Forward(batch, logits_.data());
    const auto t1 = Clock::now();
    if (!st.ok()) {
      std::fprintf(stderr, "forward failed: %s\n", std::string(st.message()).c_str());
      std::exit(1);
    }
    return Seconds(t0, t1);
  }
  void Reset() { next_ = 0; }

 private:
  CpuBackend* backend_;
  int64_t bs_;
  int32_t next_ = 0;
  std::vector<float> logits_;
};

std::vector<int32_t> Tokens(int64_t n, int64_t vocab, int64_t seed) {
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i)
    t[i] = static_cast<int32_t>(3 + (i * 7919 + seed * 104729) % (vocab - 3));
  return t;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2);
}

// Prompt tokens of each decoded sequence (prefilled untimed): decode step s (from 0) attends over
// kPromptTokens + s + 1 positions.
constexpr int64_t kPromptTokens = 16;

// Seconds of each of `steps` decode steps of `batch` sequences (kPromptTokens-token prompts,
// untimed); `before_step` (if any) runs, untimed, before each.
std::vector<double> DecodeSteps(CpuBackend* backend, int64_t batch, int64_t steps,
                                const std::function<void()>& before_step = nullptr) {
  Driver d(backend);
  std::vector<Driver::Seq> seqs(batch);
  std::vector<std::vector<int32_t>> toks(batch);
  const int64_t vocab = backend->vocab_size();
  for (int64_t i = 0; i < batch; ++i) toks[i] = Tokens(kPromptTokens, vocab, i);
  d.Step(seqs, toks);
  std::vector<double> seconds;
  for (int64_t s = 0; s < steps; ++s) {
    for (int64_t i = 0; i < batch; ++i) toks[i] = {static_cast<int32_t>(3 + (s * 31 + i) % 200)};
    if (before_step) before_step();
    seconds.push_back(d.Step(seqs, toks));
  }
  return seconds;
}

// Decode tokens/s of `batch` sequences over `steps` steps (total tokens / total time).
double DecodeRate(CpuBackend* backend, int64_t batch, int64_t steps) {
  double total = 0;
  for (double s : DecodeSteps(backend, batch, steps)) total += s;
  return static_cast<double>(batch * steps) / total;
}

double PrefillRate(CpuBackend* backend, int64_t tokens) {
  Driver d(backend);
  std::vector<Driver::Seq> seqs(1);
  return static_cast<double>(tokens) / d.Step(seqs, {Tokens(tokens, backend->vocab_size(), 99)});
}

// The layout tandem serve gives dense bf16 matrices: tiles for bf16 inputs where the tier has
// bf16 dot products.
WeightLayout AutoBf16Layout(DType input) {
  return input == DType::kBF16 && cpu::Bf16TilesPreferred() ? WeightLayout::kTiles16
                                                            : WeightLayout::kRows;
}

DType ParseKv(const std::string& s) {
  if (s == "f32") return DType::kF32;
  if (s == "fp8") return DType::kF8E4M3;
  if (s == "int8") return DType::kI8;
  return DType::kBF16;
}

int Throughput(const std::string& model_dir, const std::string& quant_name, int64_t group,
               const std::string& kv_name, DType matmul_input, int threads, int reps,
               int64_t decode_tokens, int64_t prefill_tokens, const std::vector<int64_t>& batches,
               int64_t batch_steps, bool mmap_weights, WeightLayout bf16_layout) {
  LoadOptions lo;
  lo.weight_dtype_auto = false;
  lo.weight_dtype = DType::kBF16;
  lo.map_weights = mmap_weights;
  if (!ParseWeightQuant(quant_name, &lo.quantization)) {
    std::fprintf(stderr, "bad --quantization %s\n", quant_name.c_str());
    return 2;
  }
  lo.quant_group_size = group;
  lo.quant_layout = matmul_input == DType::kI8 ? WeightLayout::kTiles16 : WeightLayout::kRows;
  lo.bf16_layout = bf16_layout;
  auto m = LoadModel(model_dir, lo);
  if (!m.ok()) {
    std::fprintf(stderr, "%s\n", std::string(m.status().message()).c_str());
    return 1;
  }
  std::shared_ptr<const Model> model = std::move(m).value();
  CpuBackendOptions bo;
  bo.num_threads = threads;
  bo.kv_dtype = ParseKv(kv_name);
  bo.matmul_input_dtype = matmul_input;
  int64_t max_batch = 1;
  for (int64_t b : batches) max_batch = std::max(max_batch, b);
  const int64_t per_seq =
      (std::max<int64_t>(prefill_tokens, kPromptTokens + std::max(decode_tokens, batch_steps)) +
       15) /
          16 +
      1;
  bo.num_blocks = per_seq * max_batch + per_seq;
  auto backend_or = CpuBackend::Create(model, bo);
  if (!backend_or.ok()) {
    std::fprintf(stderr, "%s\n", std::string(backend_or.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<CpuBackend> backend = std::move(backend_or).value();
  const int pool_threads = threads > 0 ? threads : DefaultComputeThreads();
  ThreadPool bw_pool(pool_threads);

  const ModelConfig& c = model->config();
  const double weight_bytes = static_cast<double>(model->decode_weight_bytes());
  // KV bytes read by batch-1 decode step s, and their mean over the run's steps.
  const double kv_bytes_per_position =
      static_cast<double>(CpuBackend::KvBytesPerBlock(c, 16, bo.kv_dtype)) / 16.0;
  auto step_kv_bytes = [&](int64_t s) {
    return kv_bytes_per_position * static_cast<double>(kPromptTokens + s + 1);
  };
  const double kv_bytes = (step_kv_bytes(0) + step_kv_bytes(decode_tokens - 1)) / 2.0;
  nlohmann::json out;
  out["model"] = model_dir;
  out["model_id"] = model->model_id();
  out["quantization"] = quant_name;
  out["group_size"] = lo.quantization == WeightQuant::kInt4 ? group : 0;
  out["kv_dtype"] = std::string(DTypeName(bo.kv_dtype));
  out["matmul_input_dtype"] = std::string(DTypeName(matmul_input));
  out["threads"] = pool_threads;
  out["simd"] = cpu::ActiveTierName();
  out["cpu"] = GetCpuFeatures().model;
  out["mmap_weights"] = mmap_weights;
  out["bf16_layout"] = model->bf16_layout() == WeightLayout::kTiles16 ? "tiles" : "rows";
  out["weight_bytes_per_token"] = weight_bytes;
  out["kv_bytes_per_token"] = kv_bytes;
  // Batch-1 decode against the bandwidth of its moment: before each step (untimed) one read pass
  // over 256 MiB measures the bandwidth, and the step's roofline fraction is (weight + KV bytes
  // it read) / its time / that bandwidth; a repetition's figure is the median over its steps.
  // (This machine's bandwidth drifts by tens of percent within seconds: one measurement before
  // the run judged every step against the bandwidth of another moment.) Also tokens / total time
  // (mean step), 1 / the median step, and the mean rate against the passes' median bandwidth.
  cpu::ReadBandwidthProbe probe(size_t{256} << 20, &bw_pool);
  std::vector<double> bw, dec, dec_med, pre, roof, roof_of_mean;
  std::vector<std::vector<double>> bat(batches.size());
  DecodeRate(backend.get(), 1, 2);  // warm-up: page in the weights
  // and grow the backend's activation buffers to the prefill's size: the first forward of a
  // length faults their pages in (a large share of that forward on a VM), which a server
  // pays once, not per prompt.
  PrefillRate(backend.get(), prefill_tokens);
  for (int r = 0; r < reps; ++r) {
    std::vector<double> step_bw;
    const std::vector<double> steps = DecodeSteps(backend.get(), 1, decode_tokens, [&] {
      // The pauses let each pool's workers stop spinning first: the backend's after the last
      // step would take the probe's cores, the probe's the decode's.
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      step_bw.push_back(probe.PassGBps());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    });
    double total = 0;
    std::vector<double> fractions;
    for (size_t i = 0; i < steps.size(); ++i) {
      total += steps[i];
      const double bytes = weight_bytes + step_kv_bytes(static_cast<int64_t>(i));
      fractions.push_back(bytes / steps[i] / 1e9 / step_bw[i]);
    }
    bw.push_back(Median(step_bw));
    dec.push_back(static_cast<double>(steps.size()) / total);
    dec_med.push_back(1.0 / Median(steps));
    roof.push_back(Median(fractions));
    roof_of_mean.push_back(dec.back() * (weight_bytes + kv_bytes) / 1e9 / bw.back());
    pre.push_back(PrefillRate(backend.get(), prefill_tokens));
    for (size_t i = 0; i < batches.size(); ++i) {
      bat[i].push_back(DecodeRate(backend.get(), batches[i], batch_steps));
    }
    std::fprintf(
        stderr,
        "rep %d: bw %.2f GB/s, decode %.2f tok/s (median step %.2f), %.0f%% of roofline (mean "
        "rate / median bandwidth %.0f%%), prefill %.1f tok/s\n",
        r + 1, bw.back(), dec.back(), dec_med.back(), 100 * roof.back(), 100 * roof_of_mean.back(),
        pre.back());
  }
  out["membw_GBps"] = bw;
  out["decode_b1_tok_s"] = dec;
  out["roofline_fraction"] = roof;
  out["decode_b1_median_step_tok_s"] = dec_med;
  out["roofline_fraction_of_mean"] = roof_of_mean;
  out["prefill_tok_s"] = pre;
  out["prefill_tokens"] = prefill_tokens;
  out["decode_tokens"] = decode_tokens;
  for (size_t i = 0; i < batches.size(); ++i) {
    out["batch_decode_tok_s"][std::to_string(batches[i])] = bat[i];
  }
  out["median"] = {{"membw_GBps", Median(bw)},
                   {"decode_b1_tok_s", Median(dec)},
                   {"roofline_fraction", Median(roof)},
                   {"decode_b1_median_step_tok_s", Median(dec_med)},
                   {"roofline_fraction_of_mean", Median(roof_of_mean)},
                   {"prefill_tok_s", Median(pre)}};
  for (size_t i = 0; i < batches.size(); ++i) {
    out["median"]["batch_decode_tok_s"][std::to_string(batches[i])] = Median(bat[i]);
  }
  // The spread of the repetitions beside their median: on a shared machine one figure says
  // little without it.
  auto range = [](const std::vector<double>& v) {
    return nlohmann::json::array(
        {*std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())});
  };
  out["range"] = {{"membw_GBps", range(bw)},
                  {"decode_b1_tok_s", range(dec)},
                  {"roofline_fraction", range(roof)}};
  std::fprintf(stderr,
               "median of %d: %.0f%% of roofline (range %.0f-%.0f%%), decode %.2f tok/s, bw %.2f "
               "GB/s (range %.2f-%.2f)\n",
               reps, 100 * Median(roof), 100 * *std::min_element(roof.begin(), roof.end()),
               100 * *std::max_element(roof.begin(), roof.end()), Median(dec), Median(bw),
               *std::min_element(bw.begin(), bw.end()), *std::max_element(bw.begin(), bw.end()));
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

int Accuracy(const std::string& model_dir) {
  std::ifstream in(model_dir + "/reference/once_upon_a_time.json");
  if (!in) {
    std::fprintf(stderr, "%s has no reference/once_upon_a_time.json\n", model_dir.c_str());
    return 1;
  }
  nlohmann::json j = nlohmann::json::parse(in);
  std::vector<int32_t> seq;
  for (int id : j["prompt_ids"]) seq.push_back(id);
  for (int id : j["generated_ids"]) seq.push_back(id);
  std::ifstream lf(model_dir + "/reference/once_upon_a_time.logits.f32", std::ios::binary);
  lf.seekg(0, std::ios::end);
  std::vector<float> ref(static_cast<size_t>(lf.tellg()) / sizeof(float));
  lf.seekg(0);
  lf.read(reinterpret_cast<char*>(ref.data()), ref.size() * sizeof(float));
  struct Case {
    std::string quant;
    int64_t group;
    std::string kv;
    DType weights = DType::kF32;  // dense weights' dtype in memory
    DType input = DType::kF32;    // matmul inputs
  };
  const Case cases[] = {{"none", 0, "f32"},
                        {"int8", 0, "f32"},
                        {"int4", 32, "f32"},
                        {"int4", 128, "f32"},
                        {"int8", 0, "f32", DType::kF32, DType::kBF16},
                        {"int4", 128, "f32", DType::kF32, DType::kBF16},
                        {"int8", 0, "f32", DType::kF32, DType::kI8},
                        {"int4", 32, "f32", DType::kF32, DType::kI8},
                        {"int4", 128, "f32", DType::kF32, DType::kI8},
                        {"none", 0, "f32", DType::kBF16},
                        {"none", 0, "f32", DType::kBF16, DType::kBF16},
                        {"none", 0, "bf16", DType::kBF16, DType::kBF16},
                        {"none", 0, "bf16"},
                        {"none", 0, "int8"},
                        {"none", 0, "fp8"},
                        {"int8", 0, "fp8"},
                        {"int4", 32, "int8"},
                        {"fp8", 0, "f32"},
                        {"fp8", 0, "f32", DType::kF32, DType::kBF16},
                        {"fp8", 0, "fp8"}};
  nlohmann::json out = nlohmann::json::array();
  for (const Case& k : cases) {
    LoadOptions lo;
    lo.weight_dtype_auto = false;
    lo.weight_dtype = k.weights;
    ParseWeightQuant(k.quant, &lo.quantization);
    lo.quant_group_size = k.group > 0 ? k.group : 128;
    lo.quant_layout = k.input == DType::kI8 ? WeightLayout::kTiles16 : WeightLayout::kRows;
    lo.bf16_layout = AutoBf16Layout(k.input);
    auto m = LoadModel(model_dir, lo);
    if (!m.ok()) return 1;
    std::shared_ptr<const Model> model = std::move(m).value();
    CpuBackendOptions bo;
    bo.num_blocks = 64;
    bo.kv_dtype = ParseKv(k.kv);
    bo.matmul_input_dtype = k.input;
    auto b = CpuBackend::Create(model, bo);
    if (!b.ok()) return 1;
    const int64_t vocab = (*b)->vocab_size();
    const int64_t rows = static_cast<int64_t>(ref.size()) / vocab;
    ForwardBatch batch;
    std::vector<int32_t> table;
    for (int64_t i = 0; i * 16 < rows; ++i) table.push_back(static_cast<int32_t>(i));
    batch.AddSequenceRows(std::vector<int32_t>(seq.begin(), seq.begin() + rows), 0, table, 16,
                          rows);
    std::vector<float> logits(rows * vocab);
    if (!(*b)->Forward(batch, logits.data()).ok()) return 1;
    int agree = 0;
    double worst = 0, sum_rel = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* g = logits.data() + r * vocab;
      const float* w = ref.data() + r * vocab;
      agree += std::max_element(g, g + vocab) - g == std::max_element(w, w + vocab) - w;
      double md = 0, mr = 0;
      for (int64_t v = 0; v < vocab; ++v) {
        md = std::max(md, std::fabs(double{g[v]} - w[v]));
        mr = std::max(mr, std::fabs(double{w[v]}));
      }
      worst = std::max(worst, md / mr);
      sum_rel += md / mr;
    }
    out.push_back({{"quantization", k.quant},
                   {"group_size", k.group},
                   {"kv_dtype", k.kv},
                   {"weight_dtype", std::string(DTypeName(k.weights))},
                   {"matmul_input_dtype", std::string(DTypeName(k.input))},
                   {"positions", rows},
                   {"top1_agreement", static_cast<double>(agree) / rows},
                   {"mean_rel_logits_err", sum_rel / rows},
                   {"max_rel_logits_err", worst}});
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  std::string model, quant = "none", kv = "bf16", batches = "8,16,32", matmul_input = "f32",
                     bf16_layout = "auto";
  int64_t group = 128, threads = 0, reps = 3, decode_tokens = 32, prefill_tokens = 512,
          batch_steps = 8;
  bool accuracy = false, mmap_weights = false;
  tandem::FlagSet f("quant_bench", "decode/prefill throughput and roofline per weight format");
  f.String("model", &model, "model directory");
  f.String("quantization", &quant, "none, int8 or int4");
  f.Int("group", &group, "int4 group size");
  f.String("kv", &kv, "KV dtype: f32, bf16, fp8, int8");
  f.Int("threads", &threads, "compute threads (0: one per core)");
  f.Int("reps", &reps, "repetitions");
  f.Int("decode-tokens", &decode_tokens, "batch-1 decode steps timed");
  f.Int("prefill-tokens", &prefill_tokens, "prompt length of the prefill measurement");
  f.String("batches", &batches, "batch sizes of the batched decode measurement");
  f.Int("batch-steps", &batch_steps, "decode steps timed per batch size");
  f.String("matmul-input", &matmul_input,
           "f32, bf16 (bf16 or quantized weights) or int8 (quantized)");
  f.Bool("mmap-weights", &mmap_weights,
         "bf16 weights from the checkpoint's file mapping (as tandem --mmap-weights) instead of "
         "copied into huge-page memory (the default of tandem serve)");
  f.String("bf16-layout", &bf16_layout,
           "dense bf16 matrices: auto (tiles for bf16 inputs on AVX512_BF16, as tandem serve), "
           "rows or tiles");
  f.Bool("accuracy", &accuracy, "accuracy mode (model with reference logits)");
  if (absl::Status st = f.Parse(argc, argv); !st.ok()) {
    std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
    return 2;
  }
  if (f.help_requested()) return 0;
  if (accuracy) return tandem::Accuracy(model);
  if (reps < 1 || decode_tokens < 1 || prefill_tokens < 1 || batch_steps < 1) {
    std::fprintf(stderr,
                 "--reps, --decode-tokens, --prefill-tokens and --batch-steps must be >= 1\n");
    return 2;
  }
  std::vector<int64_t> bs;
  for (absl::string_view s : absl::StrSplit(batches, ',', absl::SkipEmpty())) {
    int64_t v;
    if (absl::SimpleAtoi(s, &v)) bs.push_back(v);
  }
  tandem::DType input = tandem::DType::kF32;
  if (matmul_input == "bf16") {
    input = tandem::DType::kBF16;
  } else if (matmul_input == "int8") {
    input = tandem::DType::kI8;
  } else if (matmul_input != "f32") {
    std::fprintf(stderr, "bad --matmul-input %s\n", matmul_input.c_str());
    return 2;
  }
  tandem::WeightLayout layout = tandem::AutoBf16Layout(input);
  if (bf16_layout == "rows" || bf16_layout == "tiles") {
    layout = bf16_layout == "rows" ? tandem::WeightLayout::kRows : tandem::WeightLayout::kTiles16;
  } else if (bf16_layout != "auto") {
    std::fprintf(stderr, "bad --bf16-layout %s\n", bf16_layout.c_str());
    return 2;
  }
  return tandem::Throughput(model, quant, group, kv, input, static_cast<int>(threads),
                            static_cast<int>(reps), decode_tokens, prefill_tokens, bs, batch_steps,
                            mmap_weights, layout);
}
