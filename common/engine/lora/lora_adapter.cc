#include "common/engine/lora/lora_adapter.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/half.h"
#include "common/engine/model/safetensors.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

constexpr const char* kTargetNames[kNumLoraTargets] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                       "gate_proj", "up_proj", "down_proj"};

// A module name as PEFT writes it: one of the targets, or a fused projection split into several.
struct ModuleSpec {
  std::vector<LoraTarget> parts;  // one, or the fused parts in row order of B
  bool mlp = false;
};

bool FindModule(const std::string& name, ModuleSpec* out) {
  for (int t = 0; t < kNumLoraTargets; ++t) {
    if (name == kTargetNames[t]) {
      out->parts = {static_cast<LoraTarget>(t)};
      out->mlp = t >= static_cast<int>(LoraTarget::kGate);
      return true;
    }
  }
  if (name == "qkv_proj") {  // Phi-3
    out->parts = {LoraTarget::kQ, LoraTarget::kK, LoraTarget::kV};
    out->mlp = false;
    return true;
  }
  if (name == "gate_up_proj") {
    out->parts = {LoraTarget::kGate, LoraTarget::kUp};
    out->mlp = true;
    return true;
  }
  return false;
}

// (in, out) of a target's projection in a model of `c`.
std::pair<int64_t, int64_t> TargetShape(const ModelConfig& c, LoraTarget t) {
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  switch (t) {
    case LoraTarget::kQ:
      return {c.hidden_size, qd};
    case LoraTarget::kK:
    case LoraTarget::kV:
      return {c.hidden_size, kvd};
    case LoraTarget::kO:
      return {qd, c.hidden_size};
    case LoraTarget::kGate:
    case LoraTarget::kUp:
      return {c.hidden_size, c.intermediate_size};
    case LoraTarget::kDown:
      return {c.intermediate_size, c.hidden_size};
  }
  return {0, 0};
}

// A 64-bit hash of bytes (four multiply-rotate lanes, then mixed): fast enough for adapters of
// tens of MiB at load time. Not for adversaries: only admins load adapters.
uint64_t HashBytes(const uint8_t* p, size_t n, uint64_t seed) {
  constexpr uint64_t kP1 = 0x9e3779b185ebca87ull, kP2 = 0xc2b2ae3d27d4eb4full;
  uint64_t lane[4] = {seed ^ kP1, seed ^ kP2, seed + kP1, seed - kP2};
  auto rotl = [](uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      lane[l] = rotl(lane[l] + w * kP2, 31) * kP1;
    }
  }
  uint64_t h = rotl(lane[0], 1) + rotl(lane[1], 7) + rotl(lane[2], 12) + rotl(lane[3], 18);
  for (; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  h ^= n;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 33);
}

float ElementAsFloat(const SafetensorsEntry& e, int64_t i) {
  uint16_t h;
  switch (e.dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, e.data + 4 * i, 4);
      return f;
    }
    case DType::kBF16:
      std::memcpy(&h, e.data + 2 * i, 2);
      return Bf16ToFloat(h);
    default:
      std::memcpy(&h, e.data + 2 * i, 2);
      return Fp16ToFloat(h);
  }
}

// The two tensors of one (layer, module) found in the file.
struct FoundPair {
  const SafetensorsEntry* a = nullptr;
  const SafetensorsEntry* b = nullptr;
  ModuleSpec module;
  std::string module_name;
};

std::string ReadFile(const std::string& path, bool* ok) {
  std::ifstream in(path, std::ios::binary);
  *ok = static_cast<bool>(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

const char* LoraTargetName(LoraTarget t) { return kTargetNames[static_cast<int>(t)]; }

absl::StatusOr<std::shared_ptr<const LoraAdapter>> LoadLoraAdapter(const std::string& name,
                                                                   const std::string& dir,
                                                                   const ModelConfig& config,
                                                                   const LoraLimits& limits) {
  const std::string what = absl::StrCat("LoRA adapter '", name, "' (", dir, "): ");
  auto refuse = [&](const std::string& why) { return absl::InvalidArgumentError(what + why); };
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(what + "not a directory");
  }
  bool ok = false;
  const std::string config_text = ReadFile((fs::path(dir) / "adapter_config.json").string(), &ok);
  if (!ok) return absl::NotFoundError(what + "no adapter_config.json");
  nlohmann::json cfg = nlohmann::json::parse(config_text, nullptr, /*allow_exceptions=*/false);
  if (!cfg.is_object()) return refuse("adapter_config.json is not a JSON object");

  auto adapter = std::make_shared<LoraAdapter>();
  adapter->name = name;
  adapter->path = dir;
  if (auto it = cfg.find("peft_type"); it != cfg.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>() != "LORA") {
      return refuse(absl::StrCat("peft_type ", it->dump(), " is not LORA"));
    }
  }
  if (auto it = cfg.find("base_model_name_or_path"); it != cfg.end() && it->is_string()) {
    adapter->base_model = it->get<std::string>();
  }
  auto r = cfg.find("r");
  if (r == cfg.end() || !r->is_number_integer() || r->get<int64_t>() < 1) {
    return refuse("adapter_config.json needs r, a positive integer");
  }
  adapter->rank = r->get<int64_t>();
  if (adapter->rank > limits.max_lora_rank) {
    return refuse(
        absl::StrCat("rank ", adapter->rank, " is over --max-lora-rank ", limits.max_lora_rank));
  }
  adapter->alpha = 8;  // PEFT's default lora_alpha
  if (auto it = cfg.find("lora_alpha"); it != cfg.end() && !it->is_null()) {
    if (!it->is_number()) return refuse("lora_alpha must be a number");
    adapter->alpha = it->get<double>();
  }
  if (auto it = cfg.find("use_rslora"); it != cfg.end() && !it->is_null()) {
    if (!it->is_boolean()) return refuse("use_rslora must be true or false");
    adapter->rslora = it->get<bool>();
  }
  if (auto it = cfg.find("bias"); it != cfg.end() && !it->is_null() && *it != "none") {
    return refuse(absl::StrCat("bias ", it->dump(), " is not supported (only \"none\")"));
  }
  if (auto it = cfg.find("use_dora"); it != cfg.end() && it->is_boolean() && it->get<bool>()) {
    return refuse("DoRA (use_dora) is not supported");
  }
  for (const char* key : {"modules_to_save", "rank_pattern", "alpha_pattern"}) {
    if (auto it = cfg.find(key); it != cfg.end() && !it->is_null() && !it->empty()) {
      return refuse(absl::StrCat(key, " is not supported (", it->dump(), ")"));
    }
  }
  if (auto it = cfg.find("target_modules"); it != cfg.end() && it->is_array()) {
    for (const auto& m : *it) {
      ModuleSpec spec;
      if (!m.is_string() || !FindModule(m.get<std::string>(), &spec)) {
        return refuse(absl::StrCat("target module ", m.dump(),
                                   " is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, "
                                   "up_proj, down_proj, qkv_proj, gate_up_proj"));
      }
    }
  }
  adapter->scale = static_cast<float>(
      adapter->alpha / (adapter->rslora ? std::sqrt(static_cast<double>(adapter->rank))
                                        : static_cast<double>(adapter->rank)));

  const std::string weights_path = (fs::path(dir) / "adapter_model.safetensors").string();
  if (!fs::exists(weights_path, ec)) {
    return absl::NotFoundError(what + "no adapter_model.safetensors");
  }
  auto file = SafetensorsFile::Open(weights_path);
  if (!file.ok()) return refuse(std::string(file.status().message()));
  const std::string trained_for =
      adapter->base_model.empty() ? "" : absl::StrCat(" (trained for '", adapter->base_model, "')");

  // (layer, module name) -> its A and B.
  std::map<std::pair<int64_t, std::string>, FoundPair> found;
  for (const SafetensorsEntry& e : (*file)->header().entries) {
    const std::string& n = e.name;
    const size_t at = n.find("layers.");
    const bool is_a = n.size() > 14 && n.compare(n.size() - 14, 14, ".lora_A.weight") == 0;
    const bool is_b = n.size() > 14 && n.compare(n.size() - 14, 14, ".lora_B.weight") == 0;
    if (at == std::string::npos || (!is_a && !is_b)) {
      return refuse(absl::StrCat("tensor '", n,
                                 "' is not a layer's lora_A / lora_B weight (embedding, lm_head "
                                 "and other modules are not supported)"));
    }
    // layers.{i}.{self_attn|mlp}.{module}.lora_X.weight
    const std::string rest = n.substr(at + 7, n.size() - 14 - at - 7);
    const size_t dot = rest.find('.');
    int64_t layer = -1;
    if (dot == std::string::npos || !absl::SimpleAtoi(rest.substr(0, dot), &layer) || layer < 0) {
      return refuse(absl::StrCat("tensor '", n, "': no layer index"));
    }
    std::string path = rest.substr(dot + 1);
    std::string module = path.substr(path.rfind('.') + 1);
    const std::string parent = path.substr(0, path.size() - module.size());
    ModuleSpec spec;
    if (!FindModule(module, &spec) || (parent != "self_attn." && parent != "mlp.")) {
      return refuse(absl::StrCat("tensor '", n, "': module '", path,
                                 "' is not one of self_attn.{q,k,v,o}_proj, "
                                 "mlp.{gate,up,down}_proj (or qkv_proj, gate_up_proj)"));
    }
    if (layer >= config.num_layers) {
      return refuse(absl::StrCat("tensor '", n, "': layer ", layer, " but the model has ",
                                 config.num_layers, " layers", trained_for));
    }
    if (spec.mlp && config.num_experts > 0) {
      return refuse(absl::StrCat("tensor '", n,
                                 "': MLP adapters on a mixture-of-experts model are not "
                                 "supported (attention projections only)"));
    }
    if (e.dtype != DType::kF32 && e.dtype != DType::kBF16 && e.dtype != DType::kF16) {
      return refuse(absl::StrCat("tensor '", n, "': dtype must be F32, BF16 or F16"));
    }
    FoundPair& pair = found[{layer, module}];
    pair.module = spec;
    pair.module_name = module;
    (is_a ? pair.a : pair.b) = &e;
  }
  if (found.empty()) return refuse("adapter_model.safetensors holds no LoRA weights");

  // Check shapes and lay the matrices out: (layer, target) order, 64-byte aligned.
  struct Placement {
    int64_t layer;
    LoraTarget target;
    const SafetensorsEntry* a;
    const SafetensorsEntry* b;
    int64_t b_row0;  // first row of B (fused modules: this part's rows)
    int64_t in, out;
    DType dtype;
    size_t a_off, b_off;
  };
  std::vector<Placement> placements;
  size_t total = 0;
  auto align = [](size_t x) { return (x + 63) / 64 * 64; };
  const int64_t rank = adapter->rank;
  for (const auto& [key, pair] : found) {
    const std::string tensor = absl::StrCat("layers.", key.first, ".", key.second);
    if (pair.a == nullptr || pair.b == nullptr) {
      return refuse(absl::StrCat(tensor, ": ", pair.a == nullptr ? "lora_B" : "lora_A",
                                 " without its ", pair.a == nullptr ? "lora_A" : "lora_B"));
    }
    const auto [in, out0] = TargetShape(config, pair.module.parts[0]);
    int64_t out_total = 0;
    for (LoraTarget t : pair.module.parts) out_total += TargetShape(config, t).second;
    const std::vector<int64_t> want_a = {rank, in}, want_b = {out_total, rank};
    if (pair.a->shape != want_a || pair.b->shape != want_b) {
      return refuse(absl::StrCat(
          tensor, ": lora_A [", absl::StrJoin(pair.a->shape, ", "), "] and lora_B [",
          absl::StrJoin(pair.b->shape, ", "), "], this model (r ", rank, ") needs [",
          absl::StrJoin(want_a, ", "), "] and [", absl::StrJoin(want_b, ", "), "]", trained_for));
    }
    // --lora-dtype, else the file's (bf16 when both are, else f32).
    const DType dtype = limits.dtype.has_value() ? *limits.dtype
                        : pair.a->dtype == DType::kBF16 && pair.b->dtype == DType::kBF16
                            ? DType::kBF16
                            : DType::kF32;
    int64_t row0 = 0;
    for (LoraTarget t : pair.module.parts) {
      const int64_t out = TargetShape(config, t).second;
      Placement p{key.first, t, pair.a, pair.b, row0, in, out, dtype, 0, 0};
      row0 += out;
      p.a_off = total;
      total = align(total + static_cast<size_t>(rank * in) * DTypeSize(dtype));
      p.b_off = total;
      total = align(total + static_cast<size_t>(out * rank) * DTypeSize(dtype));
      placements.push_back(p);
    }
  }
  adapter->storage.assign(total, 0);
  adapter->layers.assign(config.num_layers, {});
  uint8_t* base = adapter->storage.data();
  uint64_t key = HashBytes(reinterpret_cast<const uint8_t*>(&adapter->scale), sizeof(float),
                           static_cast<uint64_t>(rank));
  bool present[kNumLoraTargets] = {};
  for (const Placement& p : placements) {
    LoraMatrices& m = adapter->layers[p.layer][static_cast<int>(p.target)];
    if (m.present()) {
      return refuse(absl::StrCat("layers.", p.layer, ".", LoraTargetName(p.target),
                                 " is given twice (on its own and in a fused module)"));
    }
    present[static_cast<int>(p.target)] = true;
    // Copies `count` elements of `e` from element `first` into `dst` as `dtype`.
    auto copy = [&](const SafetensorsEntry& e, int64_t first, int64_t count, uint8_t* dst) {
      const size_t esize = DTypeSize(e.dtype);
      if (e.dtype == p.dtype) {
        std::memcpy(dst, e.data + first * esize, static_cast<size_t>(count) * esize);
        return;
      }
      if (p.dtype == DType::kBF16) {  // rounded to nearest even
        uint16_t* h = reinterpret_cast<uint16_t*>(dst);
        for (int64_t i = 0; i < count; ++i) h[i] = FloatToBf16(ElementAsFloat(e, first + i));
        return;
      }
      float* f = reinterpret_cast<float*>(dst);
      for (int64_t i = 0; i < count; ++i) f[i] = ElementAsFloat(e, first + i);
    };
    copy(*p.a, 0, rank * p.in, base + p.a_off);
    copy(*p.b, p.b_row0 * rank, p.out * rank, base + p.b_off);
    m.a = base + p.a_off;
    m.b = base + p.b_off;
    m.dtype = p.dtype;
    m.in = p.in;
    m.out = p.out;
    const int64_t id[4] = {p.layer, static_cast<int64_t>(p.target), p.in, p.out};
    key = HashBytes(reinterpret_cast<const uint8_t*>(id), sizeof(id), key);
    key = HashBytes(base + p.a_off, static_cast<size_t>(rank * p.in) * DTypeSize(p.dtype), key);
    key = HashBytes(base + p.b_off, static_cast<size_t>(p.out * rank) * DTypeSize(p.dtype), key);
  }
  for (int t = 0; t < kNumLoraTargets; ++t) {
    if (present[t]) adapter->targets.push_back(kTargetNames[t]);
  }
  adapter->cache_key = key == 0 ? 1 : key;
  return std::shared_ptr<const LoraAdapter>(std::move(adapter));
}

}  // namespace tandem
