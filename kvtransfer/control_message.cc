#include "kvtransfer/control_message.h"

#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "kvtransfer/auth.h"

namespace tandem::kvtransfer {

std::string ControlBinding(uint64_t sender_id) {
  std::string out(8, '\0');
  std::memcpy(out.data(), &sender_id, 8);
  return out;
}

uint64_t NewSenderId() {
  absl::StatusOr<uint64_t> id = NewTransferId();  // the same generator: 64 random bits
  if (id.ok()) return *id;
  std::random_device rd;  // only if OpenSSL's generator failed
  return (static_cast<uint64_t>(rd()) << 32 | rd()) | 1;
}

std::string EncodeRequest(const ControlRequest& r) {
  std::string out(1 + 8, '\0');
  out[0] = static_cast<char>(r.kind);
  std::memcpy(out.data() + 1, &r.sender_id, 8);
  return out + r.body;
}

absl::Status DecodeRequest(absl::string_view bytes, uint8_t first_kind, uint8_t last_kind,
                           absl::string_view what, ControlRequest* r) {
  if (bytes.size() < 9)
    return absl::DataLossError(absl::StrCat(what, " control request too short"));
  const uint8_t kind = static_cast<uint8_t>(bytes[0]);
  if (kind < first_kind || kind > last_kind) {
    return absl::DataLossError(absl::StrCat("unknown ", what, " control request"));
  }
  r->kind = kind;
  std::memcpy(&r->sender_id, bytes.data() + 1, 8);
  r->body = std::string(bytes.substr(9));
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

std::string RefuseReply(const absl::Status& status) {
  return EncodeReply({wire::FrameType::kRefuse, wire::EncodeOutcome({0, 0, status})});
}

absl::Status ReplyStatus(const ControlReply& r) {
  if (r.type != wire::FrameType::kResult && r.type != wire::FrameType::kRefuse) {
    return absl::DataLossError("unexpected kv control reply");
  }
  wire::Outcome o;
  absl::Status s = wire::DecodeOutcome(r.body, &o);
  return s.ok() ? o.status : s;
}

absl::string_view ControlTransportOf(absl::string_view request) {
  if (request.empty()) return "";
  const uint8_t kind = static_cast<uint8_t>(request[0]);
  if (kind >= kNcclFirstKind && kind <= kNcclLastKind) return "nccl";
  if (kind >= kCudaIpcFirstKind && kind <= kCudaIpcLastKind) return "cuda-ipc";
  return "";
}

}  // namespace tandem::kvtransfer
