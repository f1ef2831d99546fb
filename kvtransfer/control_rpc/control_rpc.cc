#include "kvtransfer/control_rpc/control_rpc.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/call_auth.h"
#include "kvtransfer/auth.h"
#include "kvtransfer/control_rpc/front_door.h"
#include "tandem/v1/worker.grpc.pb.h"

namespace tandem::kvtransfer {

// Synchronous service: HandleControl may block while a communicator is set up, which must not
// hold one of gRPC's callback threads.
class KvControlService final : public v1::KvControl::Service {
 public:
  KvControlService(std::string secret, absl::Duration replay_window)
      : secret_(std::move(secret)), window_(replay_window), replays_(replay_window) {}

  void SetReceiver(KvReceiver* receiver) {
    std::lock_guard<std::mutex> lock(mu_);
    receiver_ = receiver;
  }
  void SetFront(FrontDoor* front) { front_ = front; }

  grpc::Status Exchange(grpc::ServerContext* context, const v1::KvControlMessage* request,
                        v1::KvControlMessage* reply) override {
    if (!secret_.empty()) {
      grpc::Status st = Authenticate(*request);
      if (!st.ok()) return st;
    }
    // The connection proved the secret (or none is required): past its handshake deadline.
    if (FrontDoor* front = front_.load(); front != nullptr) {
      front->MarkAuthenticated(context->peer());
    }
    KvReceiver* receiver;
    {
      std::lock_guard<std::mutex> lock(mu_);
      receiver = receiver_;
      if (receiver != nullptr) ++active_;
    }
    if (receiver == nullptr) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "kv control: no receiver");
    }
    absl::StatusOr<std::string> answer = receiver->HandleControl(request->message());
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--active_ == 0) idle_.notify_all();
    }
    if (!answer.ok()) {
      return grpc::Status(static_cast<grpc::StatusCode>(answer.status().code()),
                          std::string(answer.status().message()));
    }
    reply->set_message(*answer);
    if (!secret_.empty()) reply->set_proof(ControlReplyProof(secret_, request->proof(), *answer));
    return grpc::Status::OK;
  }

  // The proof of the secret over the request, its time and its nonce; then the time inside the
  // window and the nonce never seen before, so a captured request cannot be replayed.
  grpc::Status Authenticate(const v1::KvControlMessage& request) {
    auto refuse = [](const char* why) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, why);
    };
    if (request.proof().empty()) return refuse("kv control: the sender has no shared secret");
    if (!ProofMatches(request.proof(), ControlRequestProof(secret_, request.unix_ms(),
                                                           request.nonce(), request.message()))) {
      return refuse("kv control: the sender's proof does not match");
    }
    const absl::Time now = absl::Now();
    if (absl::AbsDuration(now - absl::FromUnixMillis(request.unix_ms())) > window_) {
      return refuse(
          "kv control: the request's time is outside the window (clock skew or a "
          "replay)");
    }
    if (request.nonce().size() < kAuthNonceBytes || !replays_.FirstUse(request.nonce(), now)) {
      return refuse("kv control: the request was seen before (a replay)");
    }
    return grpc::Status::OK;
  }

  // No request reaches the receiver once this returns.
  void Detach() {
    std::unique_lock<std::mutex> lock(mu_);
    receiver_ = nullptr;
    idle_.wait(lock, [&] { return active_ == 0; });
  }

 private:
  const std::string secret_;
  const absl::Duration window_;
  TokenReplayCache replays_;
  std::mutex mu_;
  std::condition_variable idle_;
  KvReceiver* receiver_ = nullptr;
  int active_ = 0;
  std::atomic<FrontDoor*> front_{nullptr};
};

absl::StatusOr<std::unique_ptr<KvControlServer>> KvControlServer::Start(
    const std::string& host, int port, const TlsOptions& tls, std::string secret,
    absl::Duration window, const KvControlLimits& limits, TransferHooks* hooks) {
  // The listener offers KvControl only; its messages prove the KV secret themselves.
  auto policy = std::make_shared<CallPolicy>();
  policy->services["tandem.v1.KvControl"] = nullptr;
  auto credentials = MakeServerCredentials(tls, std::move(policy));
  if (!credentials.ok()) return credentials.status();
  std::unique_ptr<KvControlServer> s(new KvControlServer);
  // gRPC listens on a Unix socket only its own user can reach; the front owns host:port.
  const char* tmp = getenv("TMPDIR");
  std::string dir =
      absl::StrCat(tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp", "/tandem-kvc-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("kv control: cannot make a private directory ", dir, ": ", strerror(errno)));
  }
  s->socket_dir_ = dir;
  const std::string socket_path = dir + "/grpc.sock";
  s->service_ = std::make_unique<KvControlService>(std::move(secret), window);
  grpc::ServerBuilder builder;
  grpc::ResourceQuota quota("tandem-kv-control");
  quota.Resize(static_cast<size_t>(limits.memory_budget));
  quota.SetMaxThreads(limits.max_threads);
  builder.SetResourceQuota(quota);
  builder.SetMaxReceiveMessageSize(limits.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, limits.max_streams_per_connection);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(limits.handshake_timeout)));
  int bound = 0;
  builder.AddListeningPort("unix:" + socket_path, *credentials, &bound);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || bound == 0) {
    return absl::UnavailableError(
        absl::StrCat("kv control: cannot listen on the Unix socket ", socket_path));
  }
  FrontDoorOptions front;
  front.limits = {limits.max_connections, limits.max_connections_per_peer,
                  limits.connection_memory_budget};
  front.handshake_timeout = limits.handshake_timeout;
  front.backend_path = socket_path;
  // Unpredictable, so no other process can take the names of the front's sockets first.
  absl::StatusOr<std::string> nonce = NewNonce();
  if (!nonce.ok()) return nonce.status();
  front.backend_name_prefix =
      absl::StrCat("tandem-kvc-", absl::BytesToHexString(nonce->substr(0, 8)), "-");
  front.hooks = hooks;
  auto door = FrontDoor::Start(host, port, front);
  if (!door.ok()) {
    return absl::Status(door.status().code(),
                        absl::StrCat("kv control: ", door.status().message()));
  }
  s->front_ = *std::move(door);
  s->port_ = s->front_->port();
  s->service_->SetFront(s->front_.get());
  return s;
}

int KvControlServer::open_connections() const { return front_ != nullptr ? front_->open() : 0; }
uint64_t KvControlServer::connections_refused() const {
  return front_ != nullptr ? front_->refused() : 0;
}
int64_t KvControlServer::connection_bytes() const {
  return front_ != nullptr ? front_->charged() : 0;
}
int64_t KvControlServer::connection_bytes_peak() const {
  return front_ != nullptr ? front_->charged_peak() : 0;
}

KvControlServer::~KvControlServer() { Stop(); }

void KvControlServer::SetReceiver(KvReceiver* receiver) { service_->SetReceiver(receiver); }

void KvControlServer::Stop() {
  if (service_ != nullptr) service_->Detach();
  // The calls in flight finish and their replies go out through the front before it closes (a
  // sender whose last message was answered must not see its connection cut).
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
  }
  if (front_ != nullptr) {
    front_->WaitIdle(absl::Seconds(1));
    front_->Stop();  // closes what is left; the front stays for stats
  }
  if (!socket_dir_.empty()) {
    unlink((socket_dir_ + "/grpc.sock").c_str());
    rmdir(socket_dir_.c_str());
    socket_dir_.clear();
  }
}

namespace {

class GrpcControlChannel {
 public:
  GrpcControlChannel(std::shared_ptr<grpc::ChannelCredentials> credentials, std::string secret,
                     absl::Duration timeout)
      : credentials_(std::move(credentials)), secret_(std::move(secret)), timeout_(timeout) {}

  absl::StatusOr<std::string> Exchange(const std::string& endpoint, const std::string& request) {
    std::shared_ptr<grpc::Channel> channel;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& c = channels_[endpoint];
      if (c == nullptr) {
        grpc::ChannelArguments args;
        args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
        args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
        c = grpc::CreateCustomChannel(endpoint, credentials_, args);
      }
      channel = c;
    }
    auto stub = v1::KvControl::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    v1::KvControlMessage req, reply;
    req.set_message(request);
    if (!secret_.empty()) {
      absl::StatusOr<std::string> nonce = NewNonce();
      if (!nonce.ok()) return nonce.status();
      req.set_nonce(*std::move(nonce));
      req.set_unix_ms(absl::ToUnixMillis(absl::Now()));
      req.set_proof(ControlRequestProof(secret_, req.unix_ms(), req.nonce(), request));
    }
    grpc::Status st = stub->Exchange(&context, req, &reply);
    if (!st.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                          absl::StrCat("kv control ", endpoint, ": ", st.error_message()));
    }
    if (!secret_.empty() &&
        !ProofMatches(reply.proof(), ControlReplyProof(secret_, req.proof(), reply.message()))) {
      return absl::UnauthenticatedError(absl::StrCat(
          "kv control ", endpoint, ": the receiver's proof of the shared secret is wrong"));
    }
    return std::move(*reply.mutable_message());
  }

 private:
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  const std::string secret_;
  const absl::Duration timeout_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_;
};

}  // namespace

std::string AdvertisedEndpoint(const std::string& host, const std::string& advertise_host,
                               int port) {
  std::string h = advertise_host.empty() ? host : advertise_host;
  if (h.empty() || h == "0.0.0.0" || h == "::") {
    char name[256] = {};
    h = gethostname(name, sizeof name - 1) == 0 && name[0] != '\0' ? name : "127.0.0.1";
  }
  return h.find(':') != std::string::npos ? absl::StrCat("[", h, "]:", port)
                                          : absl::StrCat(h, ":", port);
}

absl::StatusOr<ControlChannel> MakeGrpcControlChannel(const TlsOptions& tls, std::string secret,
                                                      absl::Duration timeout) {
  auto credentials = MakeChannelCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  auto channel = std::make_shared<GrpcControlChannel>(*credentials, std::move(secret), timeout);
  return ControlChannel([channel](const std::string& endpoint, const std::string& request) {
    return channel->Exchange(endpoint, request);
  });
}

}  // namespace tandem::kvtransfer
