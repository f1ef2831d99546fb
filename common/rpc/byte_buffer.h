#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "google/protobuf/message_lite.h"

namespace tandem {

// The bytes of a received message, in one string.
std::string FlattenByteBuffer(const grpc::ByteBuffer& buffer);

// Parses a request received raw (a service method marked raw), so that a malformed frame gets
// INVALID_ARGUMENT naming the message instead of gRPC's generic deserialization failure
// (UNIMPLEMENTED from a typed callback service). proto3 string fields must hold valid UTF-8.
grpc::Status ParseRawRequest(const grpc::ByteBuffer& buffer,
                             google::protobuf::MessageLite* request);

// Serializes a message into a ByteBuffer for a raw reactor.
grpc::ByteBuffer SerializeToByteBuffer(const google::protobuf::MessageLite& message);

}  // namespace tandem
