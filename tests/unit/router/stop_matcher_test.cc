// StopMatcher on its own: stop strings that span deltas, the held-back text that may start one,
// several stops at once, output that keeps or drops the stop, and multi-byte characters.

#include "router/stop_matcher.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tandem {
namespace {

// Feeds `deltas` in order; returns what each Feed released.
std::vector<std::string> FeedAll(StopMatcher& m, const std::vector<std::string>& deltas) {
  std::vector<std::string> out;
  for (const std::string& d : deltas) out.push_back(m.Feed(d));
  return out;
}

using Strings = std::vector<std::string>;

TEST(StopMatcherTest, WithoutStopsEverythingPassesAtOnce) {
  StopMatcher m({}, false);
  EXPECT_EQ(FeedAll(m, {"Hel", "lo", " world"}), (Strings{"Hel", "lo", " world"}));
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, EmptyStopStringsAreIgnored) {
  StopMatcher m({"", ""}, false);
  EXPECT_EQ(m.Feed("abc"), "abc");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcherTest, StopInsideOneDelta) {
  StopMatcher m({"STOP"}, false);
  EXPECT_EQ(m.Feed("go STOP now"), "go ");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "STOP");
  EXPECT_EQ(m.Feed("more"), "") << "nothing passes after the stop";
  EXPECT_EQ(m.Flush(), "") << "the text after the stop is dropped";
}

TEST(StopMatcherTest, StopSpanningDeltasIsHeldBackThenDropped) {
  StopMatcher m({"STOP"}, false);
  // "ST" could start the stop string: held back until the next delta decides.
  EXPECT_EQ(FeedAll(m, {"go S", "T", "OP", " now"}), (Strings{"go ", "", "", ""}));
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "STOP");
}

TEST(StopMatcherTest, HeldBackTextIsReleasedWhenNoStopFollows) {
  StopMatcher m({"STOP"}, false);
  EXPECT_EQ(m.Feed("a ST"), "a ");
  EXPECT_EQ(m.Feed("A"), "STA") << "'STA' cannot start 'STOP' any more";
  EXPECT_EQ(m.Feed("S"), "") << "a new 'S' may start it again";
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.Flush(), "S") << "the end of the stream releases the held-back text";
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcherTest, HoldsBackOnlyTheLongestPossibleStart) {
  StopMatcher m({"abab"}, false);
  // "aba" ends in "aba" (a start of "abab") and in "a": the longer one is held back.
  EXPECT_EQ(m.Feed("xaba"), "x");
  EXPECT_EQ(m.Feed("a"), "aba") << "'abaa': only the last 'a' may still start 'abab'";
  EXPECT_EQ(m.Feed("bab"), "");
  EXPECT_EQ(m.matched(), "abab");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcherTest, IncludeStopInOutput) {
  StopMatcher m({"</s>"}, true);
  EXPECT_EQ(FeedAll(m, {"done<", "/s", ">tail"}), (Strings{"done", "", "</s>"}));
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "</s>");
}

TEST(StopMatcherTest, EarliestOfSeveralStopsWins) {
  StopMatcher m({"world", "lo"}, false);
  EXPECT_EQ(m.Feed("hello world"), "hel");
  EXPECT_EQ(m.matched(), "lo");
}

TEST(StopMatcherTest, LongestStopWinsAtTheSamePosition) {
  StopMatcher m({"ab", "abc", "a"}, true);
  EXPECT_EQ(m.Feed("xabcd"), "xabc");
  EXPECT_EQ(m.matched(), "abc");
}

TEST(StopMatcherTest, HoldBackCoversEveryStop) {
  StopMatcher m({"abc", "bd"}, false);
  // "ab" may start "abc", "b" may start "bd": the longer hold covers both.
  EXPECT_EQ(m.Feed("xab"), "x");
  EXPECT_EQ(m.Feed("d"), "a") << "'bd' matched inside the held-back text";
  EXPECT_EQ(m.matched(), "bd");
}

TEST(StopMatcherTest, MultiByteCharacters) {
  // Deltas are whole characters (the detokenizer never splits one), so held-back text and
  // released text are whole characters too.
  StopMatcher m({"é!", "🙂"}, false);
  EXPECT_EQ(m.Feed("naïve café"), "naïve caf") << "'é' may start 'é!'";
  EXPECT_EQ(m.Feed("?"), "é?");
  EXPECT_EQ(m.Feed(" ok 🙂 no"), " ok ");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "🙂");
}

TEST(StopMatcherTest, MultiByteStopSpanningDeltas) {
  StopMatcher m({"日本語"}, true);
  EXPECT_EQ(FeedAll(m, {"これは日", "本", "語です"}), (Strings{"これは", "", "日本語"}));
  EXPECT_TRUE(m.stopped());
}

}  // namespace
}  // namespace tandem
