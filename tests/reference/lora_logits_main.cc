// lora_logits MODEL_DIR ADAPTER_DIR IDS NEW OUT FORMAT: what the C++ engine computes with a LoRA
// adapter for the PyTorch reference test (lora_reference_test.py) to compare against.
//   - ADAPTER_DIR: a PEFT adapter directory, or "-" for the base model alone.
//   - FORMAT: the base weights in memory: f32, bf16, int8 (per channel) or int4 (groups of 32);
//     MatMul inputs f32, KV cache f32; the adapter as served by default (--lora-dtype auto): f32
//     over f32 weights, bf16 over the others.
//   - OUT: f32 little-endian logits [len(IDS), vocab] of one prefill over IDS (comma-separated
//     token ids) on the CPU backend.
//   - stdout: "greedy: a,b,c", NEW greedy tokens the engine generates after IDS with the adapter
//     (prefill, then decode steps over the paged KV cache), alone and then (second line,
//     "mixed: ...") in one batch with two other requests: the base model and a second copy of
//     the adapter under another name, on other prompts.

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/engine/backend/cpu/cpu_backend.h"
#include "common/engine/engine.h"
#include "common/engine/engine_builder.h"
#include "common/engine/lora/lora_adapter.h"
#include "common/engine/model/model.h"

namespace tandem {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "lora_logits: %s\n", message.c_str());
  return 1;
}

bool SetFormat(const std::string& format, LoadOptions* load, EngineBuildOptions* build) {
  load->weight_dtype_auto = false;
  load->weight_dtype = format == "bf16" ? DType::kBF16 : DType::kF32;
  build->weight_dtype = format == "bf16" ? "bf16" : "f32";
  if (format == "int8") {
    load->quantization = WeightQuant::kInt8;
  } else if (format == "int4") {
    load->quantization = WeightQuant::kInt4;
    load->quant_group_size = 32;
  }
  build->quantization = format == "int8" || format == "int4" ? format : "none";
  build->quant_group_size = 32;
  return format == "f32" || format == "bf16" || format == "int8" || format == "int4";
}

// Greedy tokens of each request, run together in one engine.
absl::StatusOr<std::vector<std::vector<int32_t>>> Greedy(Engine& engine,
                                                         const std::vector<EngineRequest>& rs) {
  for (const EngineRequest& r : rs) {
    if (auto st = engine.AddRequest(r); !st.ok()) return st;
  }
  std::vector<std::vector<int32_t>> out(rs.size());
  while (engine.HasWork()) {
    for (const SequenceUpdate& u : engine.Step()) {
      if (!u.status.ok()) return u.status;
      for (size_t i = 0; i < rs.size(); ++i) {
        if (rs[i].id == u.request_id) {
          out[i].insert(out[i].end(), u.new_tokens.begin(), u.new_tokens.end());
        }
      }
    }
  }
  return out;
}

int Run(const std::string& dir, const std::string& adapter_dir, const std::vector<int32_t>& ids,
        int32_t new_tokens, const std::string& out_path, const std::string& format) {
  LoadOptions load;
  load.map_weights = false;
  EngineBuildOptions b;
  if (!SetFormat(format, &load, &b)) return Fail("FORMAT must be f32, bf16, int8 or int4");
  auto model = LoadModel(dir, load);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  std::shared_ptr<const Model> shared = std::move(model).value();
  std::shared_ptr<const LoraAdapter> adapter;
  if (adapter_dir != "-") {
    LoraLimits limits;
    limits.max_lora_rank = 64;
    // As served (--lora-dtype auto): the adapter in the base weights' dtype, f32 or bf16.
    limits.dtype = format == "f32" ? DType::kF32 : DType::kBF16;
    auto a = LoadLoraAdapter("adapter", adapter_dir, shared->config(), limits);
    if (!a.ok()) return Fail(std::string(a.status().message()));
    adapter = *a;
  }
  CpuBackendOptions o;
  o.num_threads = 2;
  o.block_size = 16;
  o.num_blocks = static_cast<int64_t>(ids.size()) / 16 + 1;
  auto backend = CpuBackend::Create(shared, o);
  if (!backend.ok()) return Fail(std::string(backend.status().message()));
  std::vector<int32_t> table;
  for (int32_t blk = 0; blk < o.num_blocks; ++blk) table.push_back(blk);
  ForwardBatch batch;
  batch.AddSequenceRows(ids, 0, table, o.block_size, static_cast<int64_t>(ids.size()));
  batch.seqs.back().lora = adapter.get();
  const int64_t vocab = shared->config().vocab_size;
  std::vector<float> logits(ids.size() * static_cast<size_t>(vocab));
  if (auto st = (*backend)->Forward(batch, logits.data()); !st.ok()) {
    return Fail(std::string(st.message()));
  }
  FILE* f = std::fopen(out_path.c_str(), "wb");
  if (f == nullptr ||
      std::fwrite(logits.data(), sizeof(float), logits.size(), f) != logits.size()) {
    return Fail("cannot write " + out_path);
  }
  std::fclose(f);
  if (new_tokens == 0) return 0;

  b.model_dir = dir;
  b.num_kv_blocks = 64;
  b.threads = 2;
  b.show_progress = false;
  b.matmul_input_dtype = "f32";
  b.kv_cache_dtype = "f32";
  if (adapter != nullptr) {
    b.lora.max_loras = 2;
    b.lora.max_lora_rank = 64;
    b.lora.modules = {"adapter=" + adapter_dir, "twin=" + adapter_dir};
  }
  EngineRequest r;
  r.id = "greedy";
  r.prompt = ids;
  r.params.max_tokens = new_tokens;
  r.params.ignore_eos = true;
  r.params.temperature = 0;
  r.lora_name = adapter != nullptr ? "adapter" : "";
  std::vector<std::vector<int32_t>> runs[2];
  for (int mixed = 0; mixed < 2; ++mixed) {
    auto built = BuildEngine(b);
    if (!built.ok()) return Fail(std::string(built.status().message()));
    std::vector<EngineRequest> rs = {r};
    if (mixed == 1) {  // other prompts: the base model and the adapter under its other name
      EngineRequest base = r, twin = r;
      base.id = "base";
      base.lora_name = "";
      base.prompt = std::vector<int32_t>(ids.rbegin(), ids.rend());
      twin.id = "twin";
      twin.lora_name = adapter != nullptr ? "twin" : "";
      twin.prompt.insert(twin.prompt.begin(), ids.begin(), ids.begin() + ids.size() / 2);
      rs = {base, r, twin};
    }
    auto got = Greedy(*built->engine, rs);
    if (!got.ok()) return Fail(std::string(got.status().message()));
    runs[mixed] = *got;
  }
  std::printf("greedy: %s\n", absl::StrJoin(runs[0][0], ",").c_str());
  std::printf("mixed: %s\n", absl::StrJoin(runs[1][1], ",").c_str());
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: lora_logits MODEL_DIR ADAPTER_DIR IDS NEW OUT FORMAT\n");
    return 2;
  }
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(argv[3], ',')) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(piece, &id)) return tandem::Fail("bad token id list");
    ids.push_back(id);
  }
  int32_t new_tokens = 0;
  if (!absl::SimpleAtoi(argv[4], &new_tokens)) return tandem::Fail("bad NEW");
  return tandem::Run(argv[1], argv[2], ids, new_tokens, argv[5], argv[6]);
}
