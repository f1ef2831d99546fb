#include "kvtransfer/cuda_ipc/ipc_control.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer::cuda_ipc {
namespace {

void PutU32(std::string* out, uint32_t v) { out->append(reinterpret_cast<const char*>(&v), 4); }
void PutU64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }
void PutStr(std::string* out, absl::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s.data(), s.size());
}

// Reads little-endian fields off the front of a view; any shortfall sticks.
class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  template <class T>
  T Get() {
    T v{};
    if (in_.size() < sizeof(T)) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return v;
  }
  absl::string_view Bytes(size_t n) {
    if (in_.size() < n) {
      ok_ = false;
      return {};
    }
    absl::string_view v = in_.substr(0, n);
    in_.remove_prefix(n);
    return v;
  }
  absl::string_view Str() { return Bytes(Get<uint32_t>()); }
  absl::string_view rest() const { return in_; }
  bool ok() const { return ok_; }

 private:
  absl::string_view in_;
  bool ok_ = true;
};

}  // namespace

std::string EncodeConnect(absl::string_view device, const wire::Hello& hello, uint32_t protocol) {
  std::string out;
  PutStr(&out, device);
  PutU32(&out, protocol);
  return out + wire::EncodeHello(hello);
}

namespace {

absl::Status OtherProtocol(const char* who, uint32_t protocol) {
  // Protocol 1 had no field: its CONNECT went on with the HELLO's magic, its WELCOME ended.
  return absl::FailedPreconditionError(absl::StrCat(
      "kv layout mismatch in protocol_version: the ", who, " speaks cuda-ipc protocol ",
      protocol == 0 || protocol == wire::kHelloMagic ? 1 : protocol, ", this side ", kIpcProtocol,
      " (per-transfer admission at BEGIN): run one version on both"));
}

}  // namespace

absl::Status DecodeConnect(absl::string_view body, std::string* device, wire::Hello* hello) {
  Reader in(body);
  *device = std::string(in.Str());
  const uint32_t protocol = in.Get<uint32_t>();
  if (!in.ok()) return absl::DataLossError("cuda-ipc CONNECT too short");
  if (protocol != kIpcProtocol) return OtherProtocol("sender", protocol);
  return wire::DecodeHello(in.rest(), hello);
}

std::string WelcomeReply(const wire::Welcome& welcome, const PoolExport& pool) {
  std::string out;
  PutStr(&out, wire::EncodeWelcome(welcome));
  std::string handle = pool.handle;
  handle.resize(kIpcHandleBytes, '\0');
  out += handle;
  PutU64(&out, pool.pool_bytes);
  PutU64(&out, static_cast<uint64_t>(pool.num_blocks));
  PutU64(&out, pool.layer_stride);
  PutU64(&out, pool.block_stride);
  PutU64(&out, pool.process);
  PutStr(&out, pool.device);
  PutU32(&out, kIpcProtocol);
  return EncodeReply({wire::FrameType::kWelcome, std::move(out)});
}

absl::Status DecodeWelcomeBody(absl::string_view body, wire::Welcome* welcome, PoolExport* pool) {
  Reader in(body);
  absl::string_view w = in.Str();
  pool->handle = std::string(in.Bytes(kIpcHandleBytes));
  pool->pool_bytes = in.Get<uint64_t>();
  pool->num_blocks = static_cast<int64_t>(in.Get<uint64_t>());
  pool->layer_stride = in.Get<uint64_t>();
  pool->block_stride = in.Get<uint64_t>();
  pool->process = in.Get<uint64_t>();
  pool->device = std::string(in.Str());
  if (!in.ok()) return absl::DataLossError("cuda-ipc WELCOME too short");
  const uint32_t protocol = in.rest().empty() ? 0 : in.Get<uint32_t>();
  if (!in.ok()) return absl::DataLossError("cuda-ipc WELCOME too short");
  if (protocol != kIpcProtocol) return OtherProtocol("receiver", protocol);
  return wire::DecodeWelcome(w, welcome);
}

}  // namespace tandem::kvtransfer::cuda_ipc
