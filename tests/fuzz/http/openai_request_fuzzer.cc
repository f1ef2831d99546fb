// libFuzzer entry point: the HTTP API's body parser and OpenAI request conversion
// (router/http/openai_request.h) on arbitrary bytes. The first byte picks the endpoint, the rest
// is the body. Must never crash, hang or throw; every outcome is a request or a status.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/tokenizer.h"
#include "router/http/openai_request.h"
#include "tests/util/test_paths.h"

namespace {

struct Fixture {
  std::unique_ptr<tandem::Tokenizer> tokenizer;
  std::unique_ptr<tandem::ChatTemplate> chat_template;
  tandem::OpenAiContext context;
};

const Fixture& GetFixture() {
  static const Fixture* f = [] {
    auto* fx = new Fixture;
    fx->tokenizer = std::move(
        tandem::Tokenizer::FromModelDir(tandem::TestSourceDir() + "/models/stories260k").value());
    fx->chat_template =
        std::move(tandem::ChatTemplate::Parse(
                      tandem::BuiltinChatTemplateSource(tandem::BuiltinChatTemplate::kLlama2))
                      .value());
    fx->context.tokenizer = fx->tokenizer.get();
    fx->context.chat_template = fx->chat_template.get();
    fx->context.max_model_len = 512;
    return fx;
  }();
  return *f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Fixture& f = GetFixture();
  const auto endpoint = (data[0] & 1) != 0 ? tandem::OpenAiEndpoint::kChatCompletions
                                           : tandem::OpenAiEndpoint::kCompletions;
  std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  auto json = tandem::ParseJsonBody(body, f.context.limits);
  if (!json.ok()) return 0;
  auto request = tandem::ConvertOpenAiRequest(endpoint, *json, f.context);
  if (request.ok()) {
    std::string bytes;
    request->generate.SerializeToString(&bytes);  // a valid message (strings are UTF-8)
  }
  return 0;
}
