#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/tokenizer/chat_template_ast.h"
#include "common/tokenizer/chat_template_builtins.h"

namespace tandem::chat_template {

struct RenderLimits {
  Budget budget;
  size_t max_output_bytes = 16 << 20;
  int max_call_depth = 32;  // nested macro calls
};

// Runs a parsed template with `variables` (a JSON object) as its globals, plus Jinja's and
// Hugging Face's global functions: range, namespace, dict, raise_exception, strftime_now.
absl::StatusOr<std::string> Render(const Body& body, const Json& variables,
                                   const RenderLimits& limits);

}  // namespace tandem::chat_template
