#include "common/engine/lora/lora_writer.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/base/half.h"
#include "common/engine/model/model_writer.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

uint64_t SplitMix(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

absl::Status WriteRandomLoraAdapter(const ModelConfig& c, const RandomLoraOptions& o,
                                    const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  struct Shape {
    const char* name;
    const char* parent;
    int64_t in, out;
  };
  const Shape shapes[] = {{"q_proj", "self_attn", d, qd},  {"k_proj", "self_attn", d, kvd},
                          {"v_proj", "self_attn", d, kvd}, {"o_proj", "self_attn", qd, d},
                          {"gate_proj", "mlp", d, f},      {"up_proj", "mlp", d, f},
                          {"down_proj", "mlp", f, d}};
  uint64_t state = o.seed * 0x2545f4914f6cdd1dull + 17;
  const double a = o.std * std::sqrt(3.0);
  std::vector<std::vector<uint8_t>> buffers;
  std::vector<NamedTensor> tensors;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (const Shape& s : shapes) {
      bool wanted = false;
      for (const std::string& t : o.targets) wanted = wanted || t == s.name;
      if (!wanted) continue;
      for (int ab = 0; ab < 2; ++ab) {
        const int64_t rows = ab == 0 ? o.rank : s.out, cols = ab == 0 ? s.in : o.rank;
        std::vector<uint8_t>& buf = buffers.emplace_back(rows * cols * DTypeSize(o.dtype));
        for (int64_t i = 0; i < rows * cols; ++i) {
          const double u = static_cast<double>(SplitMix(&state) >> 11) * 0x1.0p-53;
          const float v = static_cast<float>((2 * u - 1) * a);
          if (o.dtype == DType::kBF16) {
            reinterpret_cast<uint16_t*>(buf.data())[i] = FloatToBf16(v);
          } else {
            reinterpret_cast<float*>(buf.data())[i] = v;
          }
        }
        NamedTensor t;
        t.name = absl::StrCat("base_model.model.model.layers.", l, ".", s.parent, ".", s.name,
                              ab == 0 ? ".lora_A.weight" : ".lora_B.weight");
        t.tensor.dtype = o.dtype;
        t.tensor.shape = {rows, cols};
        t.tensor.data = buf.data();
        tensors.push_back(std::move(t));
      }
    }
  }
  if (auto st = WriteSafetensors((fs::path(dir) / "adapter_model.safetensors").string(), tensors);
      !st.ok()) {
    return st;
  }
  nlohmann::json cfg = {{"peft_type", "LORA"},
                        {"task_type", "CAUSAL_LM"},
                        {"r", o.rank},
                        {"lora_alpha", o.alpha},
                        {"use_rslora", o.rslora},
                        {"lora_dropout", 0.0},
                        {"bias", "none"},
                        {"target_modules", o.targets},
                        {"base_model_name_or_path", o.base_model},
                        {"fan_in_fan_out", false},
                        {"inference_mode", true}};
  std::ofstream out(fs::path(dir) / "adapter_config.json");
  out << cfg.dump(2) << "\n";
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", dir, "/adapter_config.json"));
  return absl::OkStatus();
}

}  // namespace tandem
