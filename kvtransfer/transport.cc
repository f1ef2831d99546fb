// CreateReceiver / CreateSender: the transport is chosen at run time by name.

#include "kvtransfer/transport.h"
#include "absl/strings/str_cat.h"
#include "kvtransfer/loopback/loopback.h"
#include "kvtransfer/tcp/tcp_receiver.h"
#include "kvtransfer/tcp/tcp_sender.h"

#if TANDEM_HAVE_NCCL
#include "kvtransfer/nccl/nccl_transport.h"
#endif

namespace tandem::kvtransfer {

absl::StatusOr<std::unique_ptr<KvReceiver>> CreateReceiver(
    const ReceiverOptions& options, KvRegionAccess* access,
    KvReceiver::CompletionCallback on_complete) {
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
  return absl::InvalidArgumentError(
      absl::StrCat("unknown kv transport '", options.transport, "' (tcp, loopback, nccl)"));
}

absl::StatusOr<std::unique_ptr<KvSender>> CreateSender(const SenderOptions& options,
                                                       KvRegionAccess* access) {
  if (options.transport == "tcp") return tcp::TcpSender::Create(options, access);
  if (options.transport == "loopback") return loopback::CreateSender(options, access);
  if (options.transport == "nccl") {
#if TANDEM_HAVE_NCCL
    return nccl::CreateSender(options, access);
#else
    return absl::UnimplementedError("kv transport 'nccl' needs a build with CUDA");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown kv transport '", options.transport, "' (tcp, loopback, nccl)"));
}

}  // namespace tandem::kvtransfer
