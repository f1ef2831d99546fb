#include "tools/bench/stream_call.h"

#include "absl/strings/str_cat.h"

namespace tandem::bench {
namespace {

const char* CodeName(grpc::StatusCode code) {
  static constexpr const char* kNames[] = {"OK",
                                           "CANCELLED",
                                           "UNKNOWN",
                                           "INVALID_ARGUMENT",
                                           "DEADLINE_EXCEEDED",
                                           "NOT_FOUND",
                                           "ALREADY_EXISTS",
                                           "PERMISSION_DENIED",
                                           "RESOURCE_EXHAUSTED",
                                           "FAILED_PRECONDITION",
                                           "ABORTED",
                                           "OUT_OF_RANGE",
                                           "UNIMPLEMENTED",
                                           "INTERNAL",
                                           "UNAVAILABLE",
                                           "DATA_LOSS",
                                           "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? kNames[i] : "UNKNOWN";
}

}  // namespace

std::string StatusText(const grpc::Status& status) {
  return absl::StrCat(CodeName(status.error_code()), ": ", status.error_message());
}

double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

StreamCall::StreamCall(const RequestSpec& spec, const CallSettings& settings,
                       std::shared_ptr<LiveCall> live, DoneFn done)
    : settings_(settings),
      done_(std::move(done)),
      cancel_after_(spec.cancel_after),
      live_(live != nullptr ? std::move(live) : std::make_shared<LiveCall>()) {
  request_.set_model(settings.model);
  request_.mutable_token_ids()->mutable_ids()->Assign(spec.prompt.begin(), spec.prompt.end());
  v1::SamplingParams* s = request_.mutable_sampling();
  s->set_temperature(settings.temperature);
  s->set_max_tokens(spec.max_tokens);
  s->set_ignore_eos(settings.ignore_eos);
  s->set_seed(static_cast<uint64_t>(spec.index) + 1);
  context_.set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(settings.timeout_s * 1e3)));
  result_.index = spec.index;
  result_.prompt_tokens = static_cast<int32_t>(spec.prompt.size());
  result_.max_tokens = spec.max_tokens;
}

void LiveCall::Cut() {
  std::shared_ptr<StreamCall> call;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cut_ = true;
    call = call_.lock();
  }
  // The local reference keeps the call (and its context) alive even if OnDone runs inline.
  if (call != nullptr) call->context_.TryCancel();
}

void StreamCall::Start(v1::Generation::Stub* stub, const RequestSpec& spec,
                       const CallSettings& settings, std::shared_ptr<LiveCall> live, DoneFn done) {
  std::shared_ptr<StreamCall> owner(
      new StreamCall(spec, settings, std::move(live), std::move(done)));
  StreamCall* call = owner.get();
  call->self_ = owner;
  bool cut = false;
  {
    std::lock_guard<std::mutex> lock(call->live_->mu_);
    call->live_->call_ = owner;
    cut = call->live_->cut_;
  }
  owner.reset();
  if (cut) call->context_.TryCancel();  // cut before it started: it fails at once
  call->sent_ = Clock::now();
  call->result_.start_s = SecondsBetween(settings.origin, call->sent_);
  stub->async()->Generate(&call->context_, &call->request_, call);
  call->StartRead(&call->response_);
  call->StartCall();
}

void StreamCall::OnReadDone(bool ok) {
  if (!ok) return;  // the stream ended; OnDone follows
  const Clock::time_point now = Clock::now();
  if (response_.has_chunk()) {
    const int n = response_.chunk().token_ids_size();
    if (n > 0) {
      int first = 0;
      if (result_.ttft_s < 0) {
        result_.ttft_s = SecondsBetween(sent_, now);
        first = 1;
      }
      const double gap = first ? 0.0 : SecondsBetween(last_token_, now) / n;
      for (int i = first; i < n; ++i) result_.itl_s.push_back(gap);
      last_token_ = now;
      result_.output_tokens += n;
      live_->received.fetch_add(n, std::memory_order_relaxed);
      if (settings_.tokens_received != nullptr) {
        settings_.tokens_received->fetch_add(n, std::memory_order_relaxed);
      }
      if (cancel_after_ > 0 && !cancel_sent_ && result_.output_tokens >= cancel_after_) {
        cancel_sent_ = true;
        context_.TryCancel();
      }
    }
  } else if (response_.has_final()) {
    result_.has_final = true;
    result_.final = response_.final();
  }
  StartRead(&response_);
}

void StreamCall::OnDone(const grpc::Status& status) {
  result_.e2e_s = SecondsBetween(sent_, Clock::now());
  bool cut = false;
  {
    std::lock_guard<std::mutex> lock(live_->mu_);
    cut = live_->cut_;
  }
  if (status.ok()) {
    result_.ok = true;
  } else if (cut && status.error_code() == grpc::StatusCode::CANCELLED) {
    result_.cut = true;
  } else if (cancel_sent_ && status.error_code() == grpc::StatusCode::CANCELLED) {
    result_.cancelled = true;
  } else {
    result_.error = StatusText(status);
  }
  DoneFn done = std::move(done_);
  CallResult result = std::move(result_);
  // Released before `done`, which may let the runner finish and destroy the channel: the call
  // (and its ClientContext) must be gone by then. LiveCall::Cut may hold it a moment longer,
  // but only while the runner waits for its calls.
  self_.reset();  // may delete this
  done(std::move(result));
}

}  // namespace tandem::bench
