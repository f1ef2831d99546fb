#include "common/rpc/byte_buffer.h"

#include <vector>

namespace tandem {

std::string FlattenByteBuffer(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  out.reserve(buffer.Length());
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

grpc::Status ParseRawRequest(const grpc::ByteBuffer& buffer,
                             google::protobuf::MessageLite* request) {
  if (request->ParseFromString(FlattenByteBuffer(buffer))) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      "request: not a valid " + request->GetTypeName() +
                          " message (malformed frame, or a string field that is not UTF-8)");
}

grpc::ByteBuffer SerializeToByteBuffer(const google::protobuf::MessageLite& message) {
  std::string bytes = message.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace tandem
