#include "common/engine/spec/ngram_proposer.h"

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(NgramProposerTest, ProposesWhatFollowedTheLongestMatchingSuffix) {
  //                        0  1  2  3  4  5  6  7  8  9
  std::vector<int32_t> t = {5, 6, 7, 8, 9, 1, 6, 7, 2, 6, 7};
  // Suffix [6, 7] occurs at 6..7 (followed by 2) and at 1..2 (followed by 8): the most recent.
  EXPECT_EQ(NgramProposer::Lookup(t, 2, 1, 3), (std::vector<int32_t>{2, 6, 7}));
  // With n = 3 first: [2, 6, 7] never occurred earlier; falls back to n = 2.
  EXPECT_EQ(NgramProposer::Lookup(t, 3, 1, 2), (std::vector<int32_t>{2, 6}));
  // A longer n wins when it matches.
  std::vector<int32_t> u = {1, 2, 3, 9, 2, 3, 4, 1, 2, 3};
  EXPECT_EQ(NgramProposer::Lookup(u, 3, 1, 2), (std::vector<int32_t>{9, 2}));
  EXPECT_EQ(NgramProposer::Lookup(u, 2, 1, 2), (std::vector<int32_t>{4, 1}));
}

TEST(NgramProposerTest, NoMatchOrTooShortGivesNothing) {
  EXPECT_TRUE(NgramProposer::Lookup({1, 2, 3, 4}, 3, 1, 4).empty());
  EXPECT_TRUE(NgramProposer::Lookup({7}, 3, 1, 4).empty());
  EXPECT_TRUE(NgramProposer::Lookup({}, 3, 1, 4).empty());
  // min_n = 2 refuses single-token matches.
  EXPECT_TRUE(NgramProposer::Lookup({3, 5, 4, 3}, 3, 2, 2).empty());
  EXPECT_EQ(NgramProposer::Lookup({3, 5, 4, 3}, 3, 1, 2), (std::vector<int32_t>{5, 4}));
}

TEST(NgramProposerTest, RepeatingSpanIsProposedKDeep) {
  // Suffix [3] last occurred one token earlier: the continuation [3] runs into the end and is
  // continued periodically.
  EXPECT_EQ(NgramProposer::Lookup({1, 3, 3}, 2, 1, 4), (std::vector<int32_t>{3, 3, 3, 3}));
  // Period 3: suffix [7, 8] at 2..3, followed by [9, 7, 8] then the proposal itself.
  EXPECT_EQ(NgramProposer::Lookup({5, 6, 7, 8, 9, 7, 8}, 2, 1, 5),
            (std::vector<int32_t>{9, 7, 8, 9, 7}));
  EXPECT_TRUE(NgramProposer::Lookup({1, 3, 3}, 2, 1, 0).empty());
}

TEST(NgramProposerTest, ProposalIsCappedAtK) {
  std::vector<int32_t> t = {1, 2, 3, 4, 5, 6, 1};
  EXPECT_EQ(NgramProposer::Lookup(t, 1, 1, 3), (std::vector<int32_t>{2, 3, 4}));
  NgramProposer p(4, 1);
  std::vector<SpecRequest> reqs(1);
  SamplingParams params;
  reqs[0].tokens = &t;
  reqs[0].k = 2;
  reqs[0].params = &params;
  std::vector<Proposal> out;
  ASSERT_TRUE(p.Propose(reqs, &out).ok());
  EXPECT_EQ(out[0].tokens, (std::vector<int32_t>{2, 3}));
  EXPECT_TRUE(out[0].q.empty());
}

}  // namespace
}  // namespace tandem
