#include "common/engine/model/model_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/engine/model/safetensors.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

constexpr size_t kDataAlignment = 64;

absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

}  // namespace

size_t SafetensorsWriter::Spec::nbytes() const {
  size_t n = DTypeSize(dtype);
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

std::string SafetensorsHeaderJson(const std::vector<SafetensorsWriter::Spec>& specs,
                                  const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsWriter::Spec& s : specs) {
    const char* dtype = SafetensorsDTypeName(s.dtype);
    nlohmann::ordered_json entry;
    entry["dtype"] = dtype != nullptr ? dtype : "?";
    entry["shape"] = s.shape;
    entry["data_offsets"] = {offset, offset + s.nbytes()};
    header[s.name] = std::move(entry);
    offset += s.nbytes();
  }
  return header.dump();
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Create(
    const std::string& path, const std::vector<Spec>& specs,
    const std::map<std::string, std::string>& metadata) {
  uint64_t data_bytes = 0;
  for (const Spec& s : specs) {
    if (SafetensorsDTypeName(s.dtype) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", s.name, "' has dtype ",
                                                     std::string(DTypeName(s.dtype)),
                                                     ", which safetensors files here do not hold"));
    }
    for (int64_t d : s.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor '", s.name, "' has a negative dimension"));
      }
    }
    data_bytes += s.nbytes();
  }
  std::string header = SafetensorsHeaderJson(specs, metadata);
  header.append((kDataAlignment - (8 + header.size()) % kDataAlignment) % kDataAlignment, ' ');
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", tmp));
  std::unique_ptr<SafetensorsWriter> writer(new SafetensorsWriter(path, fd, data_bytes));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{header.size()} >> (8 * i));
  TANDEM_RETURN_IF_ERROR(WriteAll(fd, len, sizeof len, tmp));
  TANDEM_RETURN_IF_ERROR(WriteAll(fd, header.data(), header.size(), tmp));
  return writer;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink((path_ + ".tmp").c_str());
  }
}

absl::Status SafetensorsWriter::Append(const void* data, size_t bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is closed"));
  if (written_ + bytes > data_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": appending ", bytes, " bytes after ",
                                                   written_, " exceeds the announced ",
                                                   data_bytes_));
  }
  TANDEM_RETURN_IF_ERROR(WriteAll(fd_, data, bytes, path_ + ".tmp"));
  written_ += bytes;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Finish() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is closed"));
  if (written_ != data_bytes_) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": ", written_, " of ", data_bytes_, " data bytes were written"));
  }
  const std::string tmp = path_ + ".tmp";
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot close ", tmp));
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot rename ", tmp, " to ", path_));
  }
  return absl::OkStatus();
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsWriter::Spec> specs;
  for (const NamedTensor& t : tensors) {
    specs.push_back({t.name, t.tensor.dtype, t.tensor.shape});
  }
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                          SafetensorsWriter::Create(path, specs, metadata));
  for (const NamedTensor& t : tensors) {
    if (t.tensor.nbytes() > 0 && t.tensor.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor '", t.name, "' has no data"));
    }
    TANDEM_RETURN_IF_ERROR(writer->Append(t.tensor.data, t.tensor.nbytes()));
  }
  return writer->Finish();
}

std::vector<SafetensorsWriter::Spec> ModelTensorSpecs(const ModelConfig& c, DType dtype) {
  const int64_t h = c.hidden_size;
  const int64_t f = c.intermediate_size;
  const int64_t q = c.num_heads * c.head_dim;
  const int64_t kv = c.num_kv_heads * c.head_dim;
  std::vector<SafetensorsWriter::Spec> specs;
  specs.push_back({"model.embed_tokens.weight", dtype, {c.vocab_size, h}});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    specs.push_back({p + "input_layernorm.weight", dtype, {h}});
    if (c.architecture == Architecture::kPhi3) {
      specs.push_back({p + "self_attn.qkv_proj.weight", dtype, {q + 2 * kv, h}});
    } else {
      specs.push_back({p + "self_attn.q_proj.weight", dtype, {q, h}});
      if (c.attention_bias) specs.push_back({p + "self_attn.q_proj.bias", dtype, {q}});
      specs.push_back({p + "self_attn.k_proj.weight", dtype, {kv, h}});
      if (c.attention_bias) specs.push_back({p + "self_attn.k_proj.bias", dtype, {kv}});
      specs.push_back({p + "self_attn.v_proj.weight", dtype, {kv, h}});
      if (c.attention_bias) specs.push_back({p + "self_attn.v_proj.bias", dtype, {kv}});
    }
    if (c.qk_norm) {
      specs.push_back({p + "self_attn.q_norm.weight", dtype, {c.head_dim}});
      specs.push_back({p + "self_attn.k_norm.weight", dtype, {c.head_dim}});
    }
    specs.push_back({p + "self_attn.o_proj.weight", dtype, {h, q}});
    specs.push_back({p + "post_attention_layernorm.weight", dtype, {h}});
    if (IsGemma(c.architecture)) {
      specs.push_back({p + "pre_feedforward_layernorm.weight", dtype, {h}});
      specs.push_back({p + "post_feedforward_layernorm.weight", dtype, {h}});
    }
    if (c.num_experts > 0) {
      const bool mixtral = c.architecture == Architecture::kMixtral;
      const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
      const int64_t ef = c.expert_ffn();
      specs.push_back({moe + "gate.weight", dtype, {c.num_experts, h}});
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string x = absl::StrCat(moe, "experts.", e, ".");
        specs.push_back({x + (mixtral ? "w1" : "gate_proj") + ".weight", dtype, {ef, h}});
        specs.push_back({x + (mixtral ? "w2" : "down_proj") + ".weight", dtype, {h, ef}});
        specs.push_back({x + (mixtral ? "w3" : "up_proj") + ".weight", dtype, {ef, h}});
      }
      if (c.shared_expert_intermediate_size > 0) {  // Qwen2-MoE
        const int64_t sf = c.shared_expert_intermediate_size;
        specs.push_back({moe + "shared_expert.gate_proj.weight", dtype, {sf, h}});
        specs.push_back({moe + "shared_expert.up_proj.weight", dtype, {sf, h}});
        specs.push_back({moe + "shared_expert.down_proj.weight", dtype, {h, sf}});
        specs.push_back({moe + "shared_expert_gate.weight", dtype, {1, h}});
      }
    } else if (c.architecture == Architecture::kPhi3) {
      specs.push_back({p + "mlp.gate_up_proj.weight", dtype, {2 * f, h}});
    } else {
      specs.push_back({p + "mlp.gate_proj.weight", dtype, {f, h}});
      specs.push_back({p + "mlp.up_proj.weight", dtype, {f, h}});
    }
    if (c.num_experts == 0) specs.push_back({p + "mlp.down_proj.weight", dtype, {h, f}});
  }
  specs.push_back({"model.norm.weight", dtype, {h}});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", dtype, {c.vocab_size, h}});
  return specs;
}

}  // namespace tandem
