#include "common/engine/model/safetensors.h"

#include <cstring>
#include <vector>

#include "common/engine/model/model_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/common/engine/model/test_util.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::ReadFile;
using testing_util::ScratchDir;

TEST(SafetensorsTest, WriterRoundTripsThroughTheParser) {
  ScratchDir dir("st");
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  std::vector<uint16_t> b = {0x3f80, 0x4000, 0xc040};
  std::vector<uint16_t> h = {0x3c00};
  std::vector<NamedTensor> tensors = {
      {"a", Tensor{DType::kF32, {2, 3}, a.data()}},
      {"b.bf16", Tensor{DType::kBF16, {3}, b.data()}},
      {"h", Tensor{DType::kF16, {1, 1}, h.data()}},
      {"empty", Tensor{DType::kF32, {0, 4}, nullptr}},
  };
  const std::string path = dir.file("x.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());

  const std::string bytes = ReadFile(path);
  const uint64_t n = testing_util::HeaderLength(bytes);
  EXPECT_EQ((8 + n) % 64, 0u) << "data region is 64-byte aligned (and so 8-byte padded)";
  EXPECT_EQ(bytes.size(), 8 + n + 24 + 6 + 2);
  EXPECT_EQ(bytes[8], '{');

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->header().metadata.at("format"), "pt");
  EXPECT_EQ((*f)->header().entries.size(), 4u);
  const SafetensorsEntry* ea = (*f)->Find("a");
  ASSERT_NE(ea, nullptr);
  EXPECT_EQ(ea->dtype, DType::kF32);
  EXPECT_THAT(ea->shape, ElementsAre(2, 3));
  EXPECT_EQ(ea->begin, 0u);
  EXPECT_EQ(ea->end, 24u);
  EXPECT_EQ(std::memcmp(ea->data, a.data(), 24), 0);
  const SafetensorsEntry* eb = (*f)->Find("b.bf16");
  ASSERT_NE(eb, nullptr);
  EXPECT_EQ(eb->dtype, DType::kBF16);
  EXPECT_EQ(std::memcmp(eb->data, b.data(), 6), 0);
  const SafetensorsEntry* eh = (*f)->Find("h");
  ASSERT_NE(eh, nullptr);
  EXPECT_EQ(eh->dtype, DType::kF16);
  EXPECT_THAT(eh->shape, ElementsAre(1, 1));
  const SafetensorsEntry* ee = (*f)->Find("empty");
  ASSERT_NE(ee, nullptr);
  EXPECT_EQ(ee->nbytes(), 0u);
  EXPECT_EQ((*f)->Find("nope"), nullptr);
}

TEST(SafetensorsTest, ReadsTheBundledModel) {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> f =
      SafetensorsFile::Open(testing_util::SourcePath("models/stories260k/model.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status();
  const SafetensorsEntry* e = (*f)->Find("model.embed_tokens.weight");
  ASSERT_NE(e, nullptr);
  EXPECT_THAT(e->shape, ElementsAre(512, 64));
  EXPECT_EQ(e->dtype, DType::kF32);
}

TEST(SafetensorsTest, StreamingWriterChecksByteCounts) {
  ScratchDir dir("stream");
  const std::string path = dir.file("s.safetensors");
  std::vector<SafetensorsWriter::Spec> specs = {{"x", DType::kF32, {4}}};
  {
    absl::StatusOr<std::unique_ptr<SafetensorsWriter>> w = SafetensorsWriter::Create(path, specs);
    ASSERT_TRUE(w.ok());
    float v[4] = {1, 2, 3, 4};
    ASSERT_TRUE((*w)->Append(v, 8).ok());
    absl::Status s = (*w)->Finish();
    EXPECT_FALSE(s.ok());
    EXPECT_THAT(s.message(), HasSubstr("8 of 16"));
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  {
    absl::StatusOr<std::unique_ptr<SafetensorsWriter>> w = SafetensorsWriter::Create(path, specs);
    ASSERT_TRUE(w.ok());
    float v[5] = {1, 2, 3, 4, 5};
    EXPECT_FALSE((*w)->Append(v, 20).ok());
    ASSERT_TRUE((*w)->Append(v, 16).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }
  EXPECT_TRUE(std::filesystem::exists(path));
  std::vector<SafetensorsWriter::Spec> bad = {{"i", DType::kI64, {4}}};
  EXPECT_FALSE(SafetensorsWriter::Create(dir.file("bad.safetensors"), bad).ok());
}

// Parser-level rejections on in-memory buffers: nothing is read outside [data, data + size).
std::string File(const std::string& header, size_t data_bytes) {
  return testing_util::EncodeLength(header.size()) + header + std::string(data_bytes, '\0');
}

absl::Status Parse(const std::string& bytes) {
  return ParseSafetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "mem.st")
      .status();
}

TEST(SafetensorsTest, ParserRejectsMalformedHeaders) {
  struct Case {
    std::string bytes;
    const char* expected;
  };
  const Case cases[] = {
      {"abc", "too short"},
      {testing_util::EncodeLength(~uint64_t{0}), "exceeds the limit"},
      {testing_util::EncodeLength(uint64_t{1} << 40) + "{}", "exceeds the limit"},
      {testing_util::EncodeLength(100) + "{}", "beyond the file size"},
      {File("{\"a\": ", 0), "invalid JSON"},
      {File("[1]", 0), "not a JSON object"},
      {File(R"({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8),
       "tensor 'a' has unsupported dtype 'I64'"},
      {File(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
       "tensor 'a': invalid shape"},
      {File(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", 4),
       "tensor 'a': shape [2] of F32 does not match the 4 bytes"},
      {File(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})", 8),
       "tensor 'a': invalid data_offsets [8, 4]"},
      {File(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 3),
       "tensor 'a': data_offsets [0, 4] extend beyond the data region of 3 bytes"},
      {File(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [18446744073709551612,
                                                                       18446744073709551616]}})",
            8),
       "tensor 'a'"},
      {File(R"({"a": {"dtype": "F32", "shape": [4611686018427387904, 4611686018427387904],
                      "data_offsets": [0, 0]}})",
            0),
       "tensor 'a'"},
      {File(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
            12),
       "tensor 'b': data_offsets [4, 12] overlap tensor 'a'"},
      {File(R"({"a": {"dtype": "F32", "shape": [1]}})", 4), "tensor 'a': 'data_offsets'"},
      {File(R"({"a": 5})", 4), "tensor 'a': header entry is not an object"},
      {File(R"({"__metadata__": 5})", 0), "__metadata__"},
  };
  for (const Case& c : cases) {
    absl::Status s = Parse(c.bytes);
    ASSERT_FALSE(s.ok()) << c.expected;
    EXPECT_THAT(s.message(), HasSubstr("mem.st")) << c.expected;
    EXPECT_THAT(s.message(), HasSubstr(c.expected)) << s.message();
  }
  EXPECT_TRUE(Parse(File("{}", 0)).ok());
}

}  // namespace
}  // namespace tandem
