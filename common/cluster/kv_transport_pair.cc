#include "common/cluster/kv_transport_pair.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem {
namespace {

bool Speaks(const std::vector<std::string>& spoken, std::string_view transport) {
  return std::find(spoken.begin(), spoken.end(), transport) != spoken.end();
}

std::string Describe(const KvTransportPeer& p) {
  return absl::StrCat(p.role, " worker ", p.address, " (kv transport '",
                      p.kv_transport.empty() ? "tcp" : p.kv_transport, "', GPU '", p.kv_device,
                      "')");
}

}  // namespace

std::vector<std::string> SpokenKvTransports(std::string_view kv_transport) {
  std::vector<std::string> out;
  for (absl::string_view t : absl::StrSplit(
           absl::string_view(kv_transport.data(), kv_transport.size()), ',', absl::SkipEmpty())) {
    out.emplace_back(t);
  }
  if (out.empty()) out.emplace_back("tcp");
  return out;
}

absl::StatusOr<std::string> PairKvTransport(const KvTransportPeer& sender,
                                            const KvTransportPeer& receiver) {
  const std::vector<std::string> s = SpokenKvTransports(sender.kv_transport);
  const std::vector<std::string> r = SpokenKvTransports(receiver.kv_transport);
  const bool same_gpu = !sender.kv_device.empty() && sender.kv_device == receiver.kv_device;
  if (Speaks(s, "cuda-ipc") && Speaks(r, "cuda-ipc") && same_gpu) return std::string("cuda-ipc");
  if (Speaks(s, "nccl") && Speaks(r, "nccl") && !same_gpu) return std::string("nccl");
  if (Speaks(s, "tcp") && Speaks(r, "tcp")) return std::string("tcp");

  std::string why;
  if (Speaks(s, "cuda-ipc") && Speaks(r, "cuda-ipc")) {
    why = "cuda-ipc needs both on one GPU";
  } else if (Speaks(s, "nccl") && Speaks(r, "nccl")) {
    why =
        "nccl needs them on different GPUs (NCCL refuses two ranks on one GPU): use cuda-ipc "
        "or auto";
  } else {
    why = "they share no transport: start both with the same --kv-transport (or auto)";
  }
  return absl::FailedPreconditionError(absl::StrCat("KV transport mismatch: ", Describe(sender),
                                                    " cannot send to ", Describe(receiver), ": ",
                                                    why));
}

}  // namespace tandem
