#include "decode_worker/decode_core.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/worker/lora_on_demand.h"
#include "common/worker/proto_convert.h"
#include "kvtransfer/auth.h"

namespace tandem {
namespace {

v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kAbort:
      return v1::FINISH_REASON_ABORT;
    case FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

// `split`: the TTFT split of a remote prefill whose KV arrived, for the finals; null for none.
void ToProto(const SequenceUpdate& u, const RemoteSplit* split,
             std::vector<v1::DecodeResponse>* out) {
  if (!u.new_tokens.empty()) {
    v1::DecodeResponse r;
    v1::SampleTokens* t = r.mutable_tokens();
    t->set_index(u.index);
    for (size_t i = 0; i < u.new_tokens.size(); ++i) {
      t->add_token_ids(u.new_tokens[i]);
      if (i < u.logprobs.size()) LogprobsToProto(u.logprobs[i], t->add_logprobs());
    }
    out->push_back(std::move(r));
  }
  if (u.finished) {
    v1::DecodeResponse r;
    v1::SampleFinal* f = r.mutable_final();
    f->set_index(u.index);
    f->set_finish_reason(ToProto(u.finish_reason));
    f->mutable_usage()->set_prompt_tokens(static_cast<int32_t>(u.prompt_tokens));
    f->mutable_usage()->set_completion_tokens(static_cast<int32_t>(u.completion_tokens));
    f->mutable_usage()->set_cached_tokens(static_cast<int32_t>(u.cached_tokens));
    f->mutable_usage()->set_spec_accepted_tokens(static_cast<int32_t>(u.spec_accepted_tokens));
    f->mutable_timings()->set_queue_s(absl::ToDoubleSeconds(u.queue_time));
    f->mutable_timings()->set_prefill_s(absl::ToDoubleSeconds(u.prefill_time));
    f->mutable_timings()->set_time_to_first_token_s(absl::ToDoubleSeconds(u.ttft));
    f->mutable_timings()->set_total_s(absl::ToDoubleSeconds(u.total_time));
    if (split != nullptr) {
      f->mutable_timings()->set_remote(true);
      f->mutable_timings()->set_remote_prefill_s(split->prefill_s);
      f->mutable_timings()->set_kv_transfer_s(split->transfer_s);
    }
    if (!u.status.ok()) {
      f->set_error_code(static_cast<int32_t>(u.status.code()));
      f->set_error_message(std::string(u.status.message()));
    }
    out->push_back(std::move(r));
  }
}

v1::DecodeResponse ErrorResponse(const absl::Status& st) {
  v1::DecodeResponse r;
  r.mutable_final()->set_finish_reason(v1::FINISH_REASON_ERROR);
  r.mutable_final()->set_error_code(static_cast<int32_t>(st.code()));
  r.mutable_final()->set_error_message(std::string(st.message()));
  return r;
}

}  // namespace

DecodeCore::~DecodeCore() { receiver_.reset(); }

absl::Status DecodeCore::StartReceiver(const kvtransfer::ReceiverOptions& options,
                                       kvtransfer::KvRegionAccess* regions,
                                       const ReceiverFactory& make) {
  auto receiver = make(options, regions, [this](const kvtransfer::CompletedTransfer& done) {
    OnTransferComplete(done);
  });
  if (!receiver.ok()) return receiver.status();
  receiver_ = std::move(receiver).value();
  TLOG(INFO) << "KV receiver (" << options.transport << ") on " << receiver_->endpoint();
  return absl::OkStatus();
}

std::string DecodeCore::kv_endpoint() const { return receiver_ ? receiver_->endpoint() : ""; }
uint64_t DecodeCore::incarnation() const { return receiver_ ? receiver_->incarnation() : 0; }

int64_t DecodeCore::transfers_in_flight() const {
  return receiver_ ? receiver_->num_in_flight() : 0;
}

void DecodeCore::Decode(const v1::DecodeRequest& request, ResponseCallback callback) {
  auto e = EngineRequestFromProto(request);
  if (!e.ok()) {
    callback(ErrorResponse(e.status()));
    return;
  }
  if (request.remote_prefill() && receiver_ == nullptr) {
    callback(ErrorResponse(absl::FailedPreconditionError(
        "remote_prefill: this worker does not receive KV (not in the decode role)")));
    return;
  }
  // The adapter, loaded on demand when the router says from where (before the engine's
  // admission looks it up).
  auto lora = AcquireRequestLora(engine_->engine().lora_registry().get(), request.lora_name(),
                                 request.lora_path());
  if (!lora.ok()) {
    callback(ErrorResponse(lora.status()));
    return;
  }
  e->remote_prefill = request.remote_prefill();
  // A request that ends before its KV arrived leaves its blocks fenced in the engine until the
  // receiver released them (below): a sender may still be writing them.
  e->kv_fence = e->remote_prefill;
  if (request.kv_lease_ms() > 0) e->kv_lease = absl::Milliseconds(request.kv_lease_ms());

  const std::string request_id = request.request_id();
  auto transfer_id = std::make_shared<uint64_t>(0);  // the engine thread's
  auto split = std::make_shared<RemoteSplit>();      // under mu_
  engine_->Submit(*std::move(e), [this, callback = std::move(callback), request_id, transfer_id,
                                  split](const SequenceUpdate& u) {
    if (u.reservation.has_value() && receiver_ != nullptr) {
      // Engine thread: register the expected transfer before anyone can learn its id.
      const KvReservation& res = *u.reservation;
      absl::StatusOr<std::string> key = kvtransfer::NewTransferKey();
      absl::StatusOr<uint64_t> id = NewTransferId();
      if (!key.ok() || !id.ok()) {
        // Without a random id and key the transfer could be claimed: no reservation leaves and
        // the request is cancelled (the router then prefills it on this worker).
        TLOG(ERROR) << "request " << request_id << ": " << (key.ok() ? id.status() : key.status());
        engine_->Cancel(request_id);
      } else {
        *transfer_id = *id;
        const int32_t first_block = static_cast<int32_t>(res.cached_tokens / res.block_size);
        kvtransfer::Expectation expect;
        expect.transfer_id = *transfer_id;
        expect.transfer_key = *key;
        expect.dst_blocks.assign(res.blocks.begin() + first_block, res.blocks.end());
        // Window layout: the local layers' pages exist only for the window's blocks (the cached
        // prefix's blocks are not sent at all).
        expect.window_layers = res.window_layers;
        expect.window_first = static_cast<int32_t>(
            std::max<int64_t>(0, res.window_first_block - int64_t{first_block}));
        {
          std::lock_guard<std::mutex> lock(mu_);
          transfer_to_request_[*transfer_id] = {request_id, split, res.lora_cache_key};
        }
        receiver_->Expect(expect);
        v1::DecodeResponse r;
        v1::KvReservation* out = r.mutable_reservation();
        out->set_transfer_id(*transfer_id);
        out->set_kv_endpoint(receiver_->endpoint());
        out->set_incarnation(receiver_->incarnation());
        out->set_first_block(first_block);
        out->mutable_dst_blocks()->Assign(expect.dst_blocks.begin(), expect.dst_blocks.end());
        out->set_cached_tokens(static_cast<int32_t>(res.cached_tokens));
        out->set_num_tokens(static_cast<int32_t>(res.num_tokens));
        for (int64_t l : expect.window_layers) out->add_window_layers(static_cast<int32_t>(l));
        out->set_window_first(expect.window_first);
        out->set_transfer_key(expect.transfer_key);
        out->set_lora_cache_key(res.lora_cache_key);
        callback(r);
      }
    }
    if (u.finished && (*transfer_id != 0 || u.kv_fence != 0)) {
      // Whatever the ending, the expectation goes: late KV for it is discarded. Cancel never
      // waits (this is the engine thread: every request of the worker would stall behind a
      // sender's copies in flight); the blocks of a request that ended before its KV arrived
      // stay fenced in the engine until the receiver released them (a transport thread posts).
      AsyncEngine* engine = engine_;
      const uint64_t fence = u.kv_fence;
      auto released = [engine, fence] {
        if (fence != 0) engine->Post([fence](Engine& e) { e.ReleaseKvFence(fence); });
      };
      if (*transfer_id != 0 && receiver_ != nullptr) {
        receiver_->Cancel(*transfer_id, std::move(released));
        std::lock_guard<std::mutex> lock(mu_);
        transfer_to_request_.erase(*transfer_id);
        *transfer_id = 0;
      } else {
        released();  // no expectation was registered: nothing can write the blocks
      }
    }
    std::optional<RemoteSplit> remote;
    absl::Status refused;
    if (u.finished) {
      std::lock_guard<std::mutex> lock(mu_);
      if (split->arrived) remote = *split;
      refused = split->refused;
    }
    std::vector<v1::DecodeResponse> out;
    if (!refused.ok()) {  // aborted because its transfer was refused: that is its error
      SequenceUpdate failed = u;
      failed.finish_reason = FinishReason::kError;
      failed.status = refused;
      ToProto(failed, nullptr, &out);
    } else {
      ToProto(u, remote ? &*remote : nullptr, &out);
    }
    for (const auto& r : out) callback(r);
  });
}

absl::StatusOr<uint64_t> DecodeCore::NewTransferId() {
  // Random, so that no one who learns one id (or the incarnation) can name another; unique
  // among this worker's expected transfers (Expect replaces an id already expected).
  while (true) {
    absl::StatusOr<uint64_t> id = kvtransfer::NewTransferId();
    if (!id.ok()) return id;
    std::lock_guard<std::mutex> lock(mu_);
    if (transfer_to_request_.count(*id) == 0) return id;
  }
}

void DecodeCore::OnTransferComplete(const kvtransfer::CompletedTransfer& done) {
  std::string request_id;
  std::shared_ptr<RemoteSplit> split;
  uint64_t lora_cache_key = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = transfer_to_request_.find(done.transfer_id);
    if (it == transfer_to_request_.end()) return;  // cancelled meanwhile
    request_id = it->second.request_id;
    split = it->second.split;
    lora_cache_key = it->second.lora_cache_key;
  }
  if (!done.status.ok()) {
    // The reservation stays; the router retries the prefill (possibly elsewhere).
    TLOG(WARNING) << "request " << request_id << ": KV transfer failed: " << done.status;
    return;
  }
  v1::FirstTokens first;
  if (!first.ParseFromString(done.trailer)) {
    TLOG(WARNING) << "request " << request_id << ": malformed first-token trailer";
    return;
  }
  if (first.lora_cache_key() != lora_cache_key) {
    // KV of another adapter (or of the base model) must never join this request, nor the
    // prefix cache under its adapter's hashes: the request fails, its blocks are freed unused.
    auto adapter = [](uint64_t key) {
      return key == 0 ? std::string("the base model")
                      : absl::StrCat("LoRA adapter cache key ", absl::Hex(key, absl::kZeroPad16));
    };
    const absl::Status refused = absl::FailedPreconditionError(absl::StrCat(
        "KV transfer refused: its KV was computed with ", adapter(first.lora_cache_key()),
        " but the reservation is for ", adapter(lora_cache_key)));
    TLOG(WARNING) << "request " << request_id << ": " << refused;
    {
      std::lock_guard<std::mutex> lock(mu_);
      split->refused = refused;
    }
    engine_->Cancel(request_id);
    return;
  }
  {
    // The TTFT split travels with the KV: the prefill worker's time in the trailer, this
    // worker's wait for the KV beyond it from the receiver (durations, each on its own clock).
    std::lock_guard<std::mutex> lock(mu_);
    split->arrived = true;
    split->prefill_s = std::max(0.0, first.prefill_s());
    split->transfer_s = std::max(0.0, absl::ToDoubleSeconds(done.waited) - split->prefill_s);
  }
  std::vector<int32_t> tokens(first.token_ids().begin(), first.token_ids().end());
  std::vector<TokenLogprobs> logprobs;
  for (const v1::TokenLogprobs& lp : first.logprobs()) logprobs.push_back(LogprobsFromProto(lp));
  engine_->Post(
      [request_id, tokens = std::move(tokens), logprobs = std::move(logprobs)](Engine& engine) {
        absl::Status st = engine.CompleteRemotePrefill(request_id, tokens, logprobs);
        if (!st.ok()) {
          TLOG(WARNING) << "request " << request_id << ": " << st;
        }
      });
}

void DecodeCore::Cancel(const std::string& request_id, int32_t index) {
  if (index < 0) {
    engine_->Cancel(request_id);
  } else {
    engine_->FinishSequence(request_id, index, FinishReason::kAbort);
  }
}

}  // namespace tandem
