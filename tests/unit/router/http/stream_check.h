#pragma once

// Checks shared by the tool-call parser tests: a chat output streamed one character at a time
// gives deltas that add up to the message parsed whole.

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "router/http/chat_output.h"

namespace tandem {

inline void ExpectStreamMatchesWhole(const ChatOutputOptions& o, const std::string& text) {
  SCOPED_TRACE(std::string(ToolCallParserName(o.parser)) + ": " + text);
  ChatOutput out(o);
  std::string content;
  std::vector<ChatToolCall> calls;
  auto take = [&](const ChatDelta& d) {
    content += d.content;
    for (const ToolCallDelta& c : d.calls) {
      if (c.first) {
        ASSERT_EQ(static_cast<size_t>(c.index), calls.size()) << "calls announced in order";
        calls.push_back({c.id, c.name, ""});
        EXPECT_TRUE(c.arguments.empty());
      } else {
        ASSERT_LT(static_cast<size_t>(c.index), calls.size()) << "arguments after the name";
        calls[c.index].arguments += c.arguments;
      }
    }
  };
  for (size_t i = 0; i < text.size(); ++i) take(out.Feed(text.substr(i, 1)));
  take(out.Finish());
  const ChatMessage whole = ChatOutput::Whole(o, text);
  EXPECT_EQ(content, whole.content.value_or(""));
  ASSERT_EQ(calls.size(), whole.calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].id, whole.calls[i].id);
    EXPECT_EQ(calls[i].name, whole.calls[i].name);
    EXPECT_EQ(calls[i].arguments, whole.calls[i].arguments);
  }
}

}  // namespace tandem
