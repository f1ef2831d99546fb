#include "kvtransfer/nccl/control.h"

#include <cstring>

namespace tandem::kvtransfer::nccl {

std::string EncodeRequest(const ControlRequest& r) {
  std::string out(1 + 8, '\0');
  out[0] = static_cast<char>(r.kind);
  std::memcpy(out.data() + 1, &r.sender_id, 8);
  if (r.kind == ControlKind::kConnect) {
    std::string id = r.unique_id;
    id.resize(kUniqueIdBytes, '\0');
    out += id;
  }
  out += r.body;
  return out;
}

absl::Status DecodeRequest(absl::string_view bytes, ControlRequest* r) {
  if (bytes.size() < 9) return absl::DataLossError("kv control request too short");
  const uint8_t kind = static_cast<uint8_t>(bytes[0]);
  if (kind < 1 || kind > 5) return absl::DataLossError("unknown kv control request");
  r->kind = static_cast<ControlKind>(kind);
  std::memcpy(&r->sender_id, bytes.data() + 1, 8);
  bytes.remove_prefix(9);
  if (r->kind == ControlKind::kConnect) {
    if (bytes.size() < kUniqueIdBytes) return absl::DataLossError("kv CONNECT without unique id");
    r->unique_id = std::string(bytes.substr(0, kUniqueIdBytes));
    bytes.remove_prefix(kUniqueIdBytes);
  }
  r->body = std::string(bytes);
  return absl::OkStatus();
}

std::string EncodeReply(const ControlReply& r) {
  std::string out(2, '\0');
  const uint16_t type = static_cast<uint16_t>(r.type);
  std::memcpy(out.data(), &type, 2);
  return out + r.body;
}

absl::Status DecodeReply(absl::string_view bytes, ControlReply* r) {
  if (bytes.size() < 2) return absl::DataLossError("kv control reply too short");
  uint16_t type;
  std::memcpy(&type, bytes.data(), 2);
  r->type = static_cast<wire::FrameType>(type);
  r->body = std::string(bytes.substr(2));
  return absl::OkStatus();
}

std::string ResultReply(uint64_t transfer_id, uint32_t attempt, const absl::Status& status) {
  return EncodeReply(
      {wire::FrameType::kResult, wire::EncodeOutcome({transfer_id, attempt, status})});
}

absl::Status ReplyStatus(const ControlReply& r) {
  if (r.type != wire::FrameType::kResult && r.type != wire::FrameType::kRefuse) {
    return absl::DataLossError("unexpected kv control reply");
  }
  wire::Outcome o;
  absl::Status s = wire::DecodeOutcome(r.body, &o);
  return s.ok() ? o.status : s;
}

}  // namespace tandem::kvtransfer::nccl
