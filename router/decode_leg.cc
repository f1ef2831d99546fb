#include "router/decode_leg.h"

#include "router/cluster_client.h"
#include "router/request_flow.h"

namespace tandem {

DecodeLeg::DecodeLeg(std::shared_ptr<RequestFlow> flow, std::shared_ptr<Worker> decode,
                     v1::DecodeRequest request, std::vector<int32_t> indices, int64_t load_blocks)
    : flow_(std::move(flow)),
      decode_(std::move(decode)),
      request_(std::move(request)),
      indices_(std::move(indices)),
      load_blocks_(load_blocks),
      prefill_(flow_->host(), &request_, decode_.get()) {
  decode_->inflight_requests.fetch_add(1);
  decode_->inflight_blocks.fetch_add(load_blocks_);
  decode_->routed_requests.fetch_add(1);
}

DecodeLeg::~DecodeLeg() = default;

void DecodeLeg::Start(std::shared_ptr<DecodeLeg> self) {
  self_ = std::move(self);
  decode_->stub->async()->Decode(&context_, &request_, this);
  StartRead(&message_);
  StartCall();
}

void DecodeLeg::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows
  if (message_.has_reservation()) {
    StartPrefill(message_.reservation());
  } else {
    if (message_.has_tokens() ||
        (message_.has_final() && message_.final().finish_reason() != v1::FINISH_REASON_ERROR)) {
      std::lock_guard<std::mutex> lock(mu_);
      kv_arrived_ = true;
    }
    flow_->OnResponse(this, message_);
  }
  StartRead(&message_);
}

void DecodeLeg::OnDone(const grpc::Status& status) {
  bool retry_local;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
    retry_local = retry_local_;
  }
  FinishLeg(status, retry_local);
}

void DecodeLeg::FinishLeg(const grpc::Status& status, bool retry_local) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    prefill_.CancelCall();
  }
  decode_->inflight_requests.fetch_sub(1);
  decode_->inflight_blocks.fetch_sub(load_blocks_);
  flow_->OnLegDone(this, status, retry_local);
  std::shared_ptr<DecodeLeg> self = std::move(self_);  // may delete this on return
}

void DecodeLeg::StartPrefill(const v1::KvReservation& reservation) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_) return;
  std::shared_ptr<DecodeLeg> keep = self_;
  if (!prefill_.Send(reservation,
                     [keep](const grpc::Status& status) { keep->OnPrefillDone(status); })) {
    // No prefill worker left to try: the decode worker prefills itself (the reservation is
    // released by cancelling this stream).
    retry_local_ = true;
    context_.TryCancel();
  }
}

void DecodeLeg::OnPrefillDone(const grpc::Status& status) {
  std::unique_lock<std::mutex> lock(mu_);
  prefill_.CallEnded(status);
  // Once the decode worker streams tokens it has verified the KV: a Prefill call that fails
  // afterwards (its answer was lost) is not sent again.
  if (ended_ || status.ok() || kv_arrived_) return;
  if (!prefill_.Failed(status)) {
    retry_local_ = true;
    context_.TryCancel();
    return;
  }
  // Same reservation, next attempt, another prefill worker (DESIGN §2 "Failures").
  const v1::KvReservation reservation = prefill_.reservation();
  lock.unlock();
  StartPrefill(reservation);
}

void DecodeLeg::SendCancel(const std::shared_ptr<Worker>& worker, int32_t index) {
  struct Call {
    grpc::ClientContext context;
    v1::CancelRequest request;
    v1::CancelResponse response;
  };
  auto* call = new Call;
  call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  call->request.set_request_id(request_.request_id());
  call->request.set_index(index);
  worker->stub->async()->Cancel(&call->context, &call->request, &call->response,
                                [call](grpc::Status) { delete call; });
}

void DecodeLeg::Cancel(int32_t local_index) {
  if (local_index >= 0) {
    SendCancel(decode_, local_index);
    return;
  }
  std::shared_ptr<Worker> prefill;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return;
    prefill = prefill_.worker();
  }
  SendCancel(decode_, -1);
  if (prefill) SendCancel(prefill, -1);
  context_.TryCancel();
}

}  // namespace tandem
