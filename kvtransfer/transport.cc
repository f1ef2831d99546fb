// CreateReceiver / CreateSender: the transport is chosen at run time by name.

#include "kvtransfer/transport.h"

#include "absl/strings/str_cat.h"
#include "kvtransfer/loopback/loopback.h"
#include "kvtransfer/metered.h"
#include "kvtransfer/tcp/tcp_receiver.h"
#include "kvtransfer/tcp/tcp_sender.h"

#if TANDEM_HAVE_NCCL
#include "kvtransfer/nccl/nccl_transport.h"
#endif

namespace tandem::kvtransfer {

namespace {

absl::StatusOr<std::unique_ptr<KvReceiver>> CreateTransportReceiver(
    const ReceiverOptions& options, KvRegionAccess* access,
    KvReceiver::CompletionCallback on_complete) {
  if (!options.secret.empty() && options.transport != "tcp") {
    return absl::InvalidArgumentError(absl::StrCat(
        "a kv secret applies to the tcp transport only, not '", options.transport, "'"));
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
  return absl::InvalidArgumentError(
      absl::StrCat("unknown kv transport '", options.transport, "' (tcp, loopback, nccl)"));
}

absl::StatusOr<std::unique_ptr<KvSender>> CreateTransportSender(const SenderOptions& options,
                                                                KvRegionAccess* access) {
  if (!options.secret.empty() && options.transport != "tcp") {
    return absl::InvalidArgumentError(absl::StrCat(
        "a kv secret applies to the tcp transport only, not '", options.transport, "'"));
  }
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
  if (!sender.ok() || options.hooks == nullptr) return sender;
  return MeterSender(std::move(sender).value(), options.layout, options.hooks);
}

}  // namespace tandem::kvtransfer
