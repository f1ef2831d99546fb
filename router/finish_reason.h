#pragma once

#include "tandem/v1/common.pb.h"

namespace tandem {

// A finish reason as the router's logs and metrics and the OpenAI API's `finish_reason` spell it:
// "stop", "length", "abort"; anything else is "error".
inline const char* FinishReasonLabel(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_ABORT:
      return "abort";
    default:
      return "error";
  }
}

}  // namespace tandem
