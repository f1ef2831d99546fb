#include "common/rpc/byte_buffer.h"

#include <gtest/gtest.h>

#include <string>

#include "tandem/v1/worker.pb.h"

namespace tandem {
namespace {

grpc::ByteBuffer Buffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

TEST(ByteBufferTest, RoundTrip) {
  v1::CancelRequest in;
  in.set_request_id("req-1");
  in.set_index(3);
  const grpc::ByteBuffer buffer = SerializeToByteBuffer(in);
  EXPECT_EQ(FlattenByteBuffer(buffer), in.SerializeAsString());
  v1::CancelRequest out;
  ASSERT_TRUE(ParseRawRequest(buffer, &out).ok());
  EXPECT_EQ(out.request_id(), "req-1");
  EXPECT_EQ(out.index(), 3);
}

TEST(ByteBufferTest, MultiSliceBuffer) {
  v1::CancelRequest in;
  in.set_request_id(std::string(300, 'x'));
  const std::string bytes = in.SerializeAsString();
  grpc::Slice slices[] = {grpc::Slice(bytes.substr(0, 5)), grpc::Slice(bytes.substr(5))};
  const grpc::ByteBuffer buffer(slices, 2);
  v1::CancelRequest out;
  ASSERT_TRUE(ParseRawRequest(buffer, &out).ok());
  EXPECT_EQ(out.request_id(), in.request_id());
}

TEST(ByteBufferTest, MalformedFramesAreInvalidArgumentNamingTheMessage) {
  for (const std::string& bytes : {std::string("\x12\x05\x01", 3), std::string("\xff\xff\xff\xff"),
                                   std::string("\x0a\x02\xc3\x28", 4)}) {
    v1::CancelRequest out;
    const grpc::Status st = ParseRawRequest(Buffer(bytes), &out);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(st.error_message().find("tandem.v1.CancelRequest"), std::string::npos)
        << st.error_message();
  }
}

}  // namespace
}  // namespace tandem
