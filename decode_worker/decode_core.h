#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "common/engine/async_engine.h"
#include "common/worker/handlers.h"
#include "kvtransfer/transport.h"

namespace tandem {

// The TTFT split of a remote prefill (Timings.remote_prefill_s, kv_transfer_s), known once its
// KV arrived.
struct RemoteSplit {
  bool arrived = false;
  double prefill_s = 0;   // the prefill worker's, from the transfer's trailer
  double transfer_s = 0;  // this worker's wait for the KV beyond prefill_s
  // Why the transfer was refused (its KV computed with another LoRA adapter than the
  // reservation's): the request's finals report it as their error.
  absl::Status refused;
};

// The decode role behind the worker API: turns DecodeRequests into engine requests on an
// AsyncEngine and the engine's updates into DecodeResponses. Remote-prefill requests reserve
// blocks, register the expected transfer with the KV receiver and report the reservation; when
// the prefill worker's KV and first tokens arrive, the request joins the running batch, and its
// finals carry the TTFT split (the prefill worker's time from the transfer's trailer, this
// worker's wait for the KV beyond it). A request naming a LoRA adapter this worker lacks loads
// it on demand from its lora_path (lora_on_demand.h); a transfer whose trailer names another
// adapter cache key than the reservation's is refused: the request fails with that error.
// Thread-safe: Decode/Cancel from RPC threads, updates on the engine thread, transfer
// completions on the receiver's threads.
class DecodeCore : public DecodeHandler {
 public:
  explicit DecodeCore(AsyncEngine* engine) : engine_(engine) {}
  ~DecodeCore() override;

  // Makes the KV receiver (kvtransfer::CreateReceiver; tests may wrap it).
  using ReceiverFactory = std::function<absl::StatusOr<std::unique_ptr<kvtransfer::KvReceiver>>(
      const kvtransfer::ReceiverOptions&, kvtransfer::KvRegionAccess*,
      kvtransfer::KvReceiver::CompletionCallback)>;
  // Starts receiving KV (decode role in a disaggregated cluster). Without it, remote_prefill
  // requests are refused.
  absl::Status StartReceiver(const kvtransfer::ReceiverOptions& options,
                             kvtransfer::KvRegionAccess* regions,
                             const ReceiverFactory& make = kvtransfer::CreateReceiver);
  std::string kv_endpoint() const;
  kvtransfer::KvReceiver* receiver() const { return receiver_.get(); }
  uint64_t incarnation() const;

  void Decode(const v1::DecodeRequest& request, ResponseCallback callback) override;
  void Cancel(const std::string& request_id, int32_t index) override;
  int64_t transfers_in_flight() const override;

 private:
  void OnTransferComplete(const kvtransfer::CompletedTransfer& done);
  // A random transfer id no expected transfer of this worker has.
  absl::StatusOr<uint64_t> NewTransferId();

  AsyncEngine* engine_;
  std::unique_ptr<kvtransfer::KvReceiver> receiver_;
  mutable std::mutex mu_;
  struct ExpectedTransfer {
    std::string request_id;
    std::shared_ptr<RemoteSplit> split;  // the request's, filled when its KV arrives
    uint64_t lora_cache_key = 0;         // the reservation's adapter (0: the base model)
  };
  std::unordered_map<uint64_t, ExpectedTransfer> transfer_to_request_;
};

}  // namespace tandem
