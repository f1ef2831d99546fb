#pragma once

// Reasoning separated from the answer for thinking models (vLLM's --reasoning-parser): the text
// between the reasoning tags becomes `reasoning_content`, the rest the answer (which the
// tool-call parser and any output constraint see alone). Where the output starts, in the
// reasoning or not, is read from the rendered prompt: a template that opens the block itself
// (DeepSeek-R1, QwQ, Qwen3 thinking models) or closes it (Qwen3's enable_thinking false,
// DeepSeek V3.1's thinking false) decides it, so the template's switch is honoured as the
// template implements it. Pure functions and a per-choice splitter; no I/O.

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem {

enum class ReasoningParser {
  kNone,
  kDeepSeekR1,  // <think>...</think>; the output starts in the reasoning unless the prompt
                // closed it (R1 models may omit the opening tag)
  kQwen3,       // <think>...</think>; in the reasoning when the prompt opened it, else only
                // when the output opens it
  kMistral,     // [THINK]...[/THINK] (Magistral), as kQwen3
};

// vLLM's names: deepseek_r1, qwen3, mistral; "none" turns it off.
absl::StatusOr<ReasoningParser> ReasoningParserByName(std::string_view name);
const char* ReasoningParserName(ReasoningParser parser);
// The parser a chat template implies: kNone unless it writes reasoning tags; deepseek_r1 for
// DeepSeek's templates, mistral for [THINK], qwen3 for the other <think> templates.
ReasoningParser ReasoningParserOfTemplate(std::string_view template_source);

struct ReasoningTags {
  std::string_view open;
  std::string_view close;
};
ReasoningTags TagsOf(ReasoningParser parser);

// Where an output starts.
enum class ReasoningStart {
  kAnswer,       // no reasoning (the prompt closed the block, or no parser)
  kMayOpen,      // the output may open a reasoning block with the open tag
  kInReasoning,  // the output is reasoning until the close tag
};
// From the prompt the output continues: a prompt that ends with the close tag starts the
// answer, one that ends with the open tag the reasoning. `continued` (continue_final_message:
// the final assistant message's text, else empty): inside a block it opened and left open.
ReasoningStart ReasoningStartOf(ReasoningParser parser, std::string_view prompt,
                                std::string_view continued = {});

// Splits one choice's streamed text into reasoning and answer. A tag forming at the end of what
// arrived is held back until the next text decides it; the answer's leading whitespace after a
// reasoning block is dropped.
class ReasoningSplitter {
 public:
  ReasoningSplitter(ReasoningParser parser, ReasoningStart start);
  // Appends what `text` adds to `reasoning` and `answer`.
  void Feed(std::string_view text, std::string* reasoning, std::string* answer);
  // The output ended: releases what was held.
  void Finish(std::string* reasoning, std::string* answer);
  // Whether the reasoning part has been seen (a reasoning block began).
  bool reasoned() const { return reasoned_; }

 private:
  enum class State { kStart, kReasoning, kAnswerStart, kAnswer };
  void Run(bool final, std::string* reasoning, std::string* answer);

  ReasoningTags tags_;
  State state_;
  bool in_block_at_start_;  // no open tag needed: the prompt opened the block
  bool reasoned_;
  std::string pending_;  // text not yet assigned
};

}  // namespace tandem
