#include "kvtransfer/nccl/control.h"

namespace tandem::kvtransfer::nccl {

std::string EncodeConnect(absl::string_view unique_id, absl::string_view hello) {
  std::string out(unique_id);
  out.resize(kUniqueIdBytes, '\0');
  out.append(hello.data(), hello.size());
  return out;
}

absl::Status DecodeConnect(absl::string_view body, std::string* unique_id,
                           absl::string_view* hello) {
  if (body.size() < kUniqueIdBytes) return absl::DataLossError("kv CONNECT without unique id");
  *unique_id = std::string(body.substr(0, kUniqueIdBytes));
  *hello = body.substr(kUniqueIdBytes);
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer::nccl
