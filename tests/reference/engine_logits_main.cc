// engine_logits MODEL_DIR IDS NEW OUT: what the C++ engine computes for the PyTorch reference
// test (reference_test.py) to compare against.
//   - OUT: f32 little-endian logits [len(IDS), vocab] of one prefill over IDS (comma-separated
//     token ids) on the CPU backend, with f32 weights as stored, f32 KV and f32 MatMul inputs.
//   - stdout: one line "greedy: a,b,c" with NEW greedy tokens the engine generates after IDS
//     (prefill, then decode steps over the paged KV cache).

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
#include "common/engine/model/model.h"

namespace tandem {
namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "engine_logits: %s\n", message.c_str());
  return 1;
}

int Run(const std::string& dir, const std::vector<int32_t>& ids, int32_t new_tokens,
        const std::string& out_path) {
  LoadOptions load;
  load.map_weights = false;
  auto model = LoadModel(dir, load);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  std::shared_ptr<const Model> shared = std::move(model).value();
  CpuBackendOptions o;
  o.num_threads = 2;
  o.block_size = 16;
  o.num_blocks = static_cast<int64_t>(ids.size()) / 16 + 1;
  auto backend = CpuBackend::Create(shared, o);
  if (!backend.ok()) return Fail(std::string(backend.status().message()));
  std::vector<int32_t> table;
  for (int32_t b = 0; b < o.num_blocks; ++b) table.push_back(b);
  ForwardBatch batch;
  batch.AddSequenceRows(ids, 0, table, o.block_size, static_cast<int64_t>(ids.size()));
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

  EngineBuildOptions b;
  b.model_dir = dir;
  b.num_kv_blocks = 64;
  b.threads = 2;
  b.show_progress = false;
  b.matmul_input_dtype = "f32";
  b.kv_cache_dtype = "f32";
  auto built = BuildEngine(b);
  if (!built.ok()) return Fail(std::string(built.status().message()));
  Engine& engine = *built->engine;
  EngineRequest r;
  r.id = "greedy";
  r.prompt = ids;
  r.params.max_tokens = new_tokens;
  r.params.ignore_eos = true;
  r.params.temperature = 0;
  if (auto st = engine.AddRequest(r); !st.ok()) return Fail(std::string(st.message()));
  std::vector<int32_t> greedy;
  while (engine.HasWork()) {
    for (const SequenceUpdate& u : engine.Step()) {
      if (!u.status.ok()) return Fail(std::string(u.status.message()));
      greedy.insert(greedy.end(), u.new_tokens.begin(), u.new_tokens.end());
    }
  }
  std::printf("greedy: %s\n", absl::StrJoin(greedy, ",").c_str());
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: engine_logits MODEL_DIR IDS NEW OUT\n");
    return 2;
  }
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(argv[2], ',')) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(piece, &id)) return tandem::Fail("bad token id list");
    ids.push_back(id);
  }
  int32_t new_tokens = 0;
  if (!absl::SimpleAtoi(argv[3], &new_tokens)) return tandem::Fail("bad NEW");
  return tandem::Run(argv[1], ids, new_tokens, argv[4]);
}
