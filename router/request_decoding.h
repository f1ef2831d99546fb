#pragma once

#include <grpcpp/grpcpp.h>

#include <string>

#include "common/rpc/byte_buffer.h"
#include "tandem/v1/generation.pb.h"

namespace tandem {

// Parses client requests received as raw bytes, so that malformed input gets a precise
// INVALID_ARGUMENT (naming the field that holds invalid UTF-8) instead of gRPC's generic
// deserialization failure.
grpc::Status ParseGenerateRequest(const grpc::ByteBuffer& buffer, v1::GenerateRequest* request);
grpc::Status ParseTokenizeRequest(const grpc::ByteBuffer& buffer, v1::TokenizeRequest* request);

// True when `text` is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF).
bool IsValidUtf8(const std::string& text);

}  // namespace tandem
