#include "kvtransfer/nccl/control.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kvtransfer/tcp/wire.h"

namespace tandem::kvtransfer::nccl {
namespace {

void PutU32(std::string* out, uint32_t v) { out->append(reinterpret_cast<const char*>(&v), 4); }

bool GetU32(absl::string_view* in, uint32_t* v) {
  if (in->size() < 4) return false;
  std::memcpy(v, in->data(), 4);
  in->remove_prefix(4);
  return true;
}

absl::Status OtherProtocol(const char* who, uint32_t protocol) {
  // Protocol 1 had no field: its CONNECT went on with the HELLO's magic, its WELCOME ended.
  return absl::FailedPreconditionError(
      absl::StrCat("kv layout mismatch in protocol_version: the ", who, " speaks nccl protocol ",
                   protocol == 0 || protocol == wire::kHelloMagic ? 1 : protocol, ", this side ",
                   kNcclProtocol, " (coalesced runs of regions): run one version on both"));
}

}  // namespace

std::string EncodeConnect(absl::string_view unique_id, absl::string_view hello, uint32_t protocol) {
  std::string out(unique_id);
  out.resize(kUniqueIdBytes, '\0');
  PutU32(&out, protocol);
  out.append(hello.data(), hello.size());
  return out;
}

absl::Status DecodeConnect(absl::string_view body, std::string* unique_id,
                           absl::string_view* hello) {
  if (body.size() < kUniqueIdBytes) return absl::DataLossError("kv CONNECT without unique id");
  *unique_id = std::string(body.substr(0, kUniqueIdBytes));
  body.remove_prefix(kUniqueIdBytes);
  uint32_t protocol = 0;
  if (!GetU32(&body, &protocol)) return absl::DataLossError("nccl CONNECT too short");
  if (protocol != kNcclProtocol) return OtherProtocol("sender", protocol);
  *hello = body;
  return absl::OkStatus();
}

std::string EncodeWelcomeBody(absl::string_view welcome, uint32_t max_run_regions,
                              uint32_t protocol) {
  std::string out;
  PutU32(&out, static_cast<uint32_t>(welcome.size()));
  out.append(welcome.data(), welcome.size());
  PutU32(&out, protocol);
  PutU32(&out, max_run_regions);
  return out;
}

absl::Status DecodeWelcomeBody(absl::string_view body, absl::string_view* welcome,
                               uint32_t* max_run_regions) {
  uint32_t n = 0;
  uint32_t protocol = 0;
  // Protocol 1's WELCOME was the bare metadata: its first u32 is the incarnation's low half, so
  // the lengths do not add up (or the protocol field is not 2).
  if (!GetU32(&body, &n) || body.size() < n) return OtherProtocol("receiver", 1);
  *welcome = body.substr(0, n);
  body.remove_prefix(n);
  if (!GetU32(&body, &protocol)) return OtherProtocol("receiver", 1);
  if (protocol != kNcclProtocol) return OtherProtocol("receiver", protocol);
  if (!GetU32(&body, max_run_regions) || !body.empty() || *max_run_regions == 0) {
    return absl::DataLossError("malformed nccl WELCOME");
  }
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer::nccl
