// libFuzzer entry point: chat-template parsing and rendering (common/tokenizer/
// chat_template.h). Input: a template, then optionally "\n---\n" and a JSON object of variables
// (default: a small conversation). Must never crash, hang or throw: budgets bound every render.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/tokenizer/chat_template.h"
#include "nlohmann/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view source = input;
  nlohmann::ordered_json variables = {{"messages",
                                       {{{"role", "system"}, {"content", "S"}},
                                        {{"role", "user"}, {"content", "U"}},
                                        {{"role", "assistant"}, {"content", "A"}}}},
                                      {"add_generation_prompt", true},
                                      {"bos_token", "<s>"},
                                      {"eos_token", "</s>"}};
  if (size_t sep = input.find("\n---\n"); sep != std::string_view::npos) {
    source = input.substr(0, sep);
    auto parsed = nlohmann::ordered_json::parse(input.substr(sep + 5), nullptr, false);
    if (parsed.is_object()) variables = std::move(parsed);
  }
  auto t = tandem::ChatTemplate::Parse(source);
  if (!t.ok()) return 0;
  tandem::ChatTemplateLimits limits;
  limits.max_steps = 20000;
  limits.max_output_bytes = 1 << 20;
  limits.max_work_bytes = 8 << 20;
  (void)(*t)->Render(variables, limits);
  return 0;
}
