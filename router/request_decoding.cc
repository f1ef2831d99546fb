#include "router/request_decoding.h"

#include "absl/strings/str_cat.h"
#include "common/rpc/byte_buffer.h"
#include "tandem/v1/wire_check.pb.h"

namespace tandem {
namespace {

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

}  // namespace

bool IsValidUtf8(const std::string& text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (int k = 1; k < len; ++k) {
      if ((s[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

grpc::Status ParseGenerateRequest(const grpc::ByteBuffer& buffer, v1::GenerateRequest* request) {
  const std::string bytes = FlattenByteBuffer(buffer);
  if (request->ParseFromString(bytes)) return grpc::Status::OK;
  v1::GenerateRequestBytesView view;
  if (!view.ParseFromString(bytes)) return Invalid("request: not a valid GenerateRequest message");
  if (!IsValidUtf8(view.text())) return Invalid("prompt: text is not valid UTF-8");
  if (!IsValidUtf8(view.request_id())) return Invalid("request_id: not valid UTF-8");
  if (!IsValidUtf8(view.model())) return Invalid("model: not valid UTF-8");
  if (!IsValidUtf8(view.cache_salt())) return Invalid("cache_salt: not valid UTF-8");
  for (int i = 0; i < view.sampling().stop_size(); ++i) {
    if (!IsValidUtf8(view.sampling().stop(i))) {
      return Invalid(absl::StrCat("stop: stop string ", i, " is not valid UTF-8"));
    }
  }
  return Invalid("request: not a valid GenerateRequest message");
}

grpc::Status ParseTokenizeRequest(const grpc::ByteBuffer& buffer, v1::TokenizeRequest* request) {
  const std::string bytes = FlattenByteBuffer(buffer);
  if (request->ParseFromString(bytes)) return grpc::Status::OK;
  v1::TokenizeRequestBytesView view;
  if (view.ParseFromString(bytes)) {
    if (!IsValidUtf8(view.text())) return Invalid("text: not valid UTF-8");
    if (!IsValidUtf8(view.model())) return Invalid("model: not valid UTF-8");
  }
  return Invalid("request: not a valid TokenizeRequest message");
}

}  // namespace tandem
