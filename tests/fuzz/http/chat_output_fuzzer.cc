// libFuzzer entry point: a chat output (router/http/chat_output.h) split into reasoning,
// content and tool calls by every tool-call parser, streamed in pieces and whole. The first byte
// picks the parser, the reasoning start and the piece size; the rest is the model's text. Must
// never crash, hang or throw; streamed calls are announced in order, before their arguments.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "router/http/chat_output.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t pick = data[0];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  tandem::ChatOutputOptions o;
  o.tools = (pick & 0x80) == 0;
  o.parser = static_cast<tandem::ToolCallParser>(pick % 11);  // every parser (kKimiK2 last)
  o.reasoning =
      (pick & 0x08) != 0 ? tandem::ReasoningParser::kQwen3 : tandem::ReasoningParser::kNone;
  o.start = static_cast<tandem::ReasoningStart>((pick >> 4) % 3);
  o.tool_names = {"get_weather", "add", "f"};
  o.tool_parameters = nlohmann::ordered_json::parse(R"({"add": {"properties": {
      "a": {"type": "integer"}, "b": {"type": "object"}, "c": {"type": "string"}}}})");
  o.id_base = "fuzz";
  const size_t piece = 1 + (pick >> 5);
  tandem::ChatOutput out(o);
  size_t announced = 0;
  auto take = [&](const tandem::ChatDelta& d) {
    for (const tandem::ToolCallDelta& c : d.calls) {
      if (c.first) {
        if (static_cast<size_t>(c.index) != announced) std::abort();
        ++announced;
      } else if (static_cast<size_t>(c.index) >= announced) {
        std::abort();
      }
    }
  };
  for (size_t i = 0; i < text.size(); i += piece) take(out.Feed(text.substr(i, piece)));
  take(out.Finish());
  tandem::ChatOutput::Whole(o, text);
  tandem::PythonLiteralToJson(text);
  return 0;
}
