// CheckFinish on its own: each rule, and which one wins when several apply.

#include "common/engine/finish_check.h"

#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

class FinishCheckTest : public ::testing::Test {
 protected:
  // Token 7 appended as output token 3 of 10, 13 tokens of a 100-token context.
  FinishCheckInput Input() {
    FinishCheckInput in;
    in.token = 7;
    in.stop_token_ids = stop_ids_;
    in.num_output = 3;
    in.max_tokens = 10;
    in.num_tokens = 13;
    in.max_model_len = 100;
    return in;
  }
  FinishReason Reason(const FinishCheckInput& in) { return CheckFinish(in).reason; }
  std::vector<int32_t> stop_ids_ = {11, 12};
};

TEST_F(FinishCheckTest, AnOrdinaryTokenGoesOn) {
  FinishDecision d = CheckFinish(Input());
  EXPECT_EQ(d.reason, FinishReason::kNone);
  EXPECT_TRUE(d.status.ok());
}

TEST_F(FinishCheckTest, EndOfSequenceStopsUnlessIgnoredOrConstrained) {
  FinishCheckInput in = Input();
  in.eos = true;
  EXPECT_EQ(Reason(in), FinishReason::kStop);
  in.ignore_eos = true;
  EXPECT_EQ(Reason(in), FinishReason::kNone);
  // A constraint only lets the end through where it is complete: then it ends even so.
  in.verdict.constrained = true;
  EXPECT_EQ(Reason(in), FinishReason::kStop);
}

TEST_F(FinishCheckTest, StopIdsStopEvenUnderIgnoreEos) {
  FinishCheckInput in = Input();
  in.token = 12;
  in.ignore_eos = true;
  EXPECT_EQ(Reason(in), FinishReason::kStop);
}

TEST_F(FinishCheckTest, LengthAtMaxTokensOrTheContext) {
  FinishCheckInput in = Input();
  in.num_output = 10;
  EXPECT_EQ(Reason(in), FinishReason::kLength);
  in = Input();
  in.num_output = 9;
  EXPECT_EQ(Reason(in), FinishReason::kNone);
  in.num_tokens = 100;
  EXPECT_EQ(Reason(in), FinishReason::kLength);
}

TEST_F(FinishCheckTest, CompleteConstraintAndTheRolesLastTokenStop) {
  FinishCheckInput in = Input();
  in.verdict.complete = true;
  EXPECT_EQ(Reason(in), FinishReason::kStop);
  in = Input();
  in.verdict.last_token = true;
  EXPECT_EQ(Reason(in), FinishReason::kStop);
}

TEST_F(FinishCheckTest, Precedence) {
  // A feature's error wins over everything, with its status.
  FinishCheckInput in = Input();
  in.eos = true;
  in.num_output = 10;
  in.verdict.complete = true;
  in.verdict.error = absl::ResourceExhaustedError("grammar bound");
  FinishDecision d = CheckFinish(in);
  EXPECT_EQ(d.reason, FinishReason::kError);
  EXPECT_EQ(d.status.code(), absl::StatusCode::kResourceExhausted);
  // A stop token or a complete constraint on the last allowed token is a stop, not length.
  in = Input();
  in.num_output = 10;
  in.token = 11;
  EXPECT_EQ(Reason(in), FinishReason::kStop);
  in.token = 7;
  in.verdict.complete = true;
  EXPECT_EQ(Reason(in), FinishReason::kStop);
  // Length wins over the role's last token (a prefill that also reached max_tokens).
  in.verdict.complete = false;
  in.verdict.last_token = true;
  EXPECT_EQ(Reason(in), FinishReason::kLength);
  // Only a non-OK status is an error.
  in = Input();
  EXPECT_TRUE(CheckFinish(in).status.ok());
}

}  // namespace
}  // namespace tandem
