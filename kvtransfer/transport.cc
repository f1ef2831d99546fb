// CreateReceiver / CreateSender: the transport is chosen at run time by name.

#include "kvtransfer/transport.h"

#include <condition_variable>
#include <cstdlib>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kvtransfer/loopback/loopback.h"
#include "kvtransfer/metered.h"
#include "kvtransfer/multi_transport.h"
#include "kvtransfer/tcp/tcp_receiver.h"
#include "kvtransfer/tcp/tcp_sender.h"

#if TANDEM_HAVE_NCCL
#include "kvtransfer/nccl/nccl_transport.h"
#endif
#if TANDEM_HAVE_CUDA_IPC
#include "kvtransfer/cuda_ipc/cuda_ipc_transport.h"
#include "kvtransfer/cuda_ipc/device.h"
#endif

namespace tandem::kvtransfer {

void KvReceiver::CancelAndWait(uint64_t transfer_id) {
  struct Released {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto r = std::make_shared<Released>();
  Cancel(transfer_id, [r] {
    std::lock_guard<std::mutex> lock(r->mu);
    r->done = true;
    r->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(r->mu);
  r->cv.wait(lock, [&] { return r->done; });
}

namespace {

[[maybe_unused]] int CudaDeviceOf(const std::string& device) {
  return device.rfind("cuda:", 0) == 0 ? std::atoi(device.c_str() + 5) : 0;
}

absl::StatusOr<std::unique_ptr<KvReceiver>> CreateTransportReceiver(
    const ReceiverOptions& options, KvRegionAccess* access,
    KvReceiver::CompletionCallback on_complete) {
  if (!options.secret.empty() && options.transport != "tcp") {
    return absl::InvalidArgumentError(absl::StrCat(
        "a kv secret applies to the tcp transport only, not '", options.transport, "'"));
  }
  if (IsMultiTransport(options.transport)) {
    return CreateMultiReceiver(options, access, std::move(on_complete));
  }
  if (options.transport == "tcp") {
    return tcp::TcpReceiver::Create(options, access, std::move(on_complete));
  }
  if (options.transport == "loopback") {
    return loopback::CreateReceiver(options, access, std::move(on_complete));
  }
  if (options.transport == "nccl") {
#if TANDEM_HAVE_NCCL
    return nccl::CreateReceiver(options, access, std::move(on_complete));
#else
    return absl::UnimplementedError("kv transport 'nccl' needs a build with CUDA");
#endif
  }
  if (options.transport == "cuda-ipc") {
#if TANDEM_HAVE_CUDA_IPC
    return cuda_ipc::CreateReceiver(options, access, std::move(on_complete));
#else
    return absl::UnimplementedError("kv transport 'cuda-ipc' needs a build with CUDA");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown kv transport '", options.transport,
                                                 "' (tcp, loopback, nccl, cuda-ipc)"));
}

absl::StatusOr<std::unique_ptr<KvSender>> CreateTransportSender(const SenderOptions& options,
                                                                KvRegionAccess* access) {
  if (!options.secret.empty() && options.transport != "tcp") {
    return absl::InvalidArgumentError(absl::StrCat(
        "a kv secret applies to the tcp transport only, not '", options.transport, "'"));
  }
  if (IsMultiTransport(options.transport)) return CreateMultiSender(options, access);
  if (options.transport == "tcp") return tcp::TcpSender::Create(options, access);
  if (options.transport == "loopback") return loopback::CreateSender(options, access);
  if (options.transport == "nccl") {
#if TANDEM_HAVE_NCCL
    return nccl::CreateSender(options, access);
#else
    return absl::UnimplementedError("kv transport 'nccl' needs a build with CUDA");
#endif
  }
  if (options.transport == "cuda-ipc") {
#if TANDEM_HAVE_CUDA_IPC
    return cuda_ipc::CreateSender(options, access);
#else
    return absl::UnimplementedError("kv transport 'cuda-ipc' needs a build with CUDA");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown kv transport '", options.transport,
                                                 "' (tcp, loopback, nccl, cuda-ipc)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<KvReceiver>> CreateReceiver(
    const ReceiverOptions& options, KvRegionAccess* access,
    KvReceiver::CompletionCallback on_complete) {
  if (options.hooks == nullptr) {
    return CreateTransportReceiver(options, access, std::move(on_complete));
  }
  return CreateMeteredReceiver(
      [&](KvReceiver::CompletionCallback metered) {
        return CreateTransportReceiver(options, access, std::move(metered));
      },
      options.layout, options.hooks, std::move(on_complete));
}

absl::StatusOr<std::unique_ptr<KvSender>> CreateSender(const SenderOptions& options,
                                                       KvRegionAccess* access) {
  auto sender = CreateTransportSender(options, access);
  // A multi-transport sender meters each of its transports (multi_transport.h).
  if (!sender.ok() || options.hooks == nullptr || IsMultiTransport(options.transport)) {
    return sender;
  }
  return MeterSender(std::move(sender).value(), options.layout, options.hooks);
}

bool NcclBuilt() {
#if TANDEM_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

bool UsesControlChannel(const std::string& transport) {
  for (absl::string_view t : absl::StrSplit(transport, ',')) {
    if (t != "nccl" && t != "cuda-ipc") return false;
  }
  return true;
}

std::string GpuId(int cuda_device) {
#if TANDEM_HAVE_CUDA_IPC
  absl::StatusOr<std::string> id = cuda_ipc::DeviceId(cuda_device);
  return id.ok() ? *id : std::string();
#else
  return std::string();
#endif
}

bool CudaIpcBuilt() {
#if TANDEM_HAVE_CUDA_IPC
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::string> ResolveTransport(const std::string& requested,
                                             const std::string& device) {
  const bool on_cuda = device.rfind("cuda", 0) == 0;
  if (requested == "auto") {
    if (!on_cuda) return std::string("tcp");
    // On a GPU: every device transport this build has; the router picks one per pair of
    // workers (common/cluster/kv_transport_pair.h).
    std::vector<std::string> spoken;
    if (NcclBuilt()) spoken.push_back("nccl");
    if (CudaIpcBuilt()) spoken.push_back("cuda-ipc");
    if (spoken.empty()) {
      return absl::FailedPreconditionError(
          "--kv-transport auto: the engine runs on the GPU but this build has no CUDA (tcp moves "
          "KV from host memory only)");
    }
    return ResolveTransport(absl::StrJoin(spoken, ","), device);
  }
  if (IsMultiTransport(requested)) {
    // Several device transports at once (what `auto` resolves to on a GPU).
    const std::vector<std::string> spoken = absl::StrSplit(requested, ',');
    for (const std::string& t : spoken) {
      if (t != "nccl" && t != "cuda-ipc") {
        return absl::InvalidArgumentError(absl::StrCat(
            "--kv-transport '", requested, "': only nccl and cuda-ipc combine, not '", t, "'"));
      }
    }
    for (const std::string& t : spoken) {
      if (auto one = ResolveTransport(t, device); !one.ok()) return one.status();
    }
    return requested;
  }
  if (requested == "tcp" || requested == "loopback") {
    if (on_cuda) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--kv-transport ", requested, " moves KV from host memory; the engine runs on the GPU (",
          device, "): use nccl or cuda-ipc, or --device cpu"));
    }
    return requested;
  }
  if (requested == "cuda-ipc") {
#if TANDEM_HAVE_CUDA_IPC
    if (!on_cuda) {
      return absl::FailedPreconditionError(
          "--kv-transport cuda-ipc moves KV in GPU memory: run the engine on the GPU (--device "
          "cuda)");
    }
    if (absl::Status st = cuda_ipc::CheckDevice(CudaDeviceOf(device)); !st.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--kv-transport cuda-ipc needs a usable GPU: ", st.message()));
    }
    return requested;
#else
    return absl::FailedPreconditionError(
        "--kv-transport cuda-ipc needs a build with CUDA (this binary has none); use tcp");
#endif
  }
  if (requested != "nccl") {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-transport must be tcp, nccl, cuda-ipc or auto, got '", requested, "'"));
  }
#if TANDEM_HAVE_NCCL
  if (absl::Status st = nccl::CheckDevice(CudaDeviceOf(device)); !st.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--kv-transport nccl needs a usable GPU: ", st.message()));
  }
  if (!on_cuda) {
    return absl::FailedPreconditionError(
        "--kv-transport nccl moves KV from GPU memory: run the engine on the GPU (--device cuda)");
  }
  return requested;
#else
  return absl::FailedPreconditionError(
      "--kv-transport nccl needs a build with CUDA and NCCL (this binary has neither); use tcp");
#endif
}

absl::StatusOr<std::string> ResolveSharedGpuTransport(const std::string& requested,
                                                      const std::string& device) {
  if (requested == "auto" && device.rfind("cuda", 0) == 0 && CudaIpcBuilt()) {
    return ResolveTransport("cuda-ipc", device);
  }
  return ResolveTransport(requested, device);
}

}  // namespace tandem::kvtransfer
