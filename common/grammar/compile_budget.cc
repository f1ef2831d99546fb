#include "common/grammar/compile_budget.h"

#include <time.h>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace tandem::grammar {
namespace {

constexpr char kBudgetPayload[] = "type.tandem/grammar.CompileBudgetExceeded";

int64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

}  // namespace

double CompileBudget::cpu_ms_used() const {
  return start_ns_ < 0 ? 0.0 : static_cast<double>(ThreadCpuNs() - start_ns_) / 1e6;
}

absl::Status CompileBudget::CheckNow() {
  if (failed_) return status_;
  if (cancelled()) {
    failed_ = true;
    status_ = absl::CancelledError("constraint: grammar compilation cancelled");
    return status_;
  }
  const int64_t now = ThreadCpuNs();
  if (start_ns_ < 0) start_ns_ = now;
  if (cpu_us_ > 0 && now - start_ns_ > cpu_us_ * 1000) {
    failed_ = true;
    const std::string limit =
        cpu_us_ % 1000 == 0 ? absl::StrCat(cpu_us_ / 1000, " ms") : absl::StrCat(cpu_us_, " us");
    status_ = absl::InvalidArgumentError(
        absl::StrCat("constraint: ", what_, " took more than its budget of ", limit,
                     " of CPU time (grammar compile budget); the grammar is too expensive to "
                     "serve"));
    status_.SetPayload(kBudgetPayload, absl::Cord("1"));
  }
  return status_;
}

bool IsBudgetExceeded(const absl::Status& status) {
  return status.GetPayload(kBudgetPayload).has_value();
}

}  // namespace tandem::grammar
