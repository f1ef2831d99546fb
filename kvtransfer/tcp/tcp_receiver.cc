#include "kvtransfer/tcp/tcp_receiver.h"

#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/cluster/kv_transfer_layout.h"
#include "kvtransfer/auth.h"
#include "kvtransfer/crc32c.h"
#include "kvtransfer/metered.h"

namespace tandem::kvtransfer::tcp {
namespace {

// Metadata an authenticated connection may hold without drawing on the budget (a BEGIN or DATA
// listing 16k blocks): part of kConnectionChargeBytes, with the scratch buffer.
constexpr int64_t kMessageAllowance = 64 << 10;
static_assert(kConnectionChargeBytes >=
              kMessageAllowance + static_cast<int64_t>(wire::kScratchBytes));

}  // namespace

absl::StatusOr<std::unique_ptr<KvReceiver>> TcpReceiver::Create(const ReceiverOptions& options,
                                                                KvRegionAccess* access,
                                                                CompletionCallback on_complete) {
  absl::Status valid = ValidateKvLayout(options.layout);
  if (!valid.ok()) return valid;
  if (access == nullptr) return absl::InvalidArgumentError("kv receiver needs region access");
  const ReceiverLimits& l = options.limits;
  if (l.max_connections <= 0 || l.max_connections_per_peer <= 0 || l.max_handshake_message < 1024) {
    return absl::InvalidArgumentError(
        "kv receiver limits: connection caps must be positive and the handshake message "
        "limit at least 1 KiB");
  }
  if (l.memory_budget < l.max_connections * kConnectionChargeBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kv receiver memory budget of ", l.memory_budget, " bytes is below what ",
        l.max_connections, " connections hold (", kConnectionChargeBytes, " bytes each)"));
  }
  std::unique_ptr<TcpReceiver> r(new TcpReceiver(options, access, std::move(on_complete)));
  int port = 0;
  absl::StatusOr<Fd> fd = Listen(options.host, options.port, &port);
  if (!fd.ok()) return fd.status();
  r->listen_fd_ = std::move(*fd);
  std::string host = options.advertise_host;
  if (host.empty()) host = options.host;
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    char name[256] = {};
    host = gethostname(name, sizeof name - 1) == 0 && name[0] != '\0' ? name : "127.0.0.1";
  }
  r->endpoint_ = host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                                     : absl::StrCat(host, ":", port);
  r->acceptor_ = std::thread([p = r.get()] { p->AcceptLoop(); });
  return std::unique_ptr<KvReceiver>(std::move(r));
}

TcpReceiver::TcpReceiver(const ReceiverOptions& options, KvRegionAccess* access,
                         CompletionCallback on_complete)
    : options_(options),
      incarnation_(NewIncarnation()),
      faults_(ResolveFaultOptions(options.faults, options.faults_from_env)),
      limiter_({options.limits.max_connections, options.limits.max_connections_per_peer,
                options.limits.memory_budget}),
      core_(std::make_unique<ReceiverCore>(options.layout, access, std::move(on_complete),
                                           options.deadline_grace, options.max_transfer_time,
                                           "kvt-recv-loop", options.hooks)) {}

TcpReceiver::~TcpReceiver() {
  stopping_ = true;
  core_->Shutdown();  // no user callbacks from here on
  listen_fd_.Shutdown();
  if (acceptor_.joinable()) acceptor_.join();
  {
    std::lock_guard<std::mutex> lock(conns_mu_);
    for (auto& c : conns_) c->fd.Shutdown();
  }
  ReapFinished(/*all=*/true);
  core_.reset();
}

void TcpReceiver::ReapFinished(bool all) {
  std::list<std::shared_ptr<Conn>> done;
  {
    std::lock_guard<std::mutex> lock(conns_mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (all || (*it)->finished) {
        done.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : done) {
    if (c->thread.joinable()) c->thread.join();
  }
}

bool TcpReceiver::Charge(int64_t bytes) { return limiter_.Charge(bytes); }

void TcpReceiver::Release(int64_t bytes) { limiter_.Release(bytes); }

TransportStats TcpReceiver::stats() const {
  TransportStats s = core_->counters().Snapshot();
  s.buffer_bytes = static_cast<uint64_t>(limiter_.charged());
  s.buffer_bytes_peak = static_cast<uint64_t>(limiter_.peak());
  return s;
}

void TcpReceiver::NoteRefused(KvRefusal reason, const std::string& peer, const absl::Status& why) {
  core_->counters().connections_refused.fetch_add(1, std::memory_order_relaxed);
  limiter_.NoteRefused(reason, peer, why, options_.hooks);
}

void TcpReceiver::AcceptLoop() {
  pthread_setname_np(pthread_self(), "kvt-accept");
  while (!stopping_) {
    pollfd p{listen_fd_.get(), POLLIN, 0};
    int r = poll(&p, 1, 100);
    ReapFinished(/*all=*/false);
    if (r <= 0 || stopping_) continue;
    int fd = accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) continue;
    auto conn = std::make_shared<Conn>();
    conn->fd = Fd(fd);
    conn->peer = PeerName(fd);
    conn->peer_host = PeerHost(conn->peer);
    conn->handshake_deadline = absl::Now() + options_.handshake_timeout;
    std::lock_guard<std::mutex> lock(conns_mu_);
    if (stopping_) break;
    KvRefusal reason;
    absl::Status admitted = limiter_.Admit(conn->peer_host, kHandshakeChargeBytes, &reason);
    if (!admitted.ok()) {
      NoteRefused(reason, conn->peer, admitted);
      continue;  // closed by ~Fd, before anything is read from it
    }
    conn->charged = kHandshakeChargeBytes;
    ConfigureSocket(fd, options_.io_timeout);
    conn->owner = core_->NewOwnerId();
    conns_.push_back(conn);
    conn->thread = std::thread([this, conn] { Serve(conn); });
  }
}

absl::Status TcpReceiver::Send(Conn* conn, wire::FrameType type, const std::string& meta) {
  const std::string frame = wire::MakeFrame(type, 0, meta);
  std::lock_guard<std::mutex> lock(conn->write_mu);
  absl::Status s = WriteBytes(conn->fd.get(), frame.data(), frame.size(), options_.io_timeout);
  if (!s.ok()) conn->fd.Shutdown();  // the reader notices and fails the connection's attempts
  return s;
}

void TcpReceiver::Reject(Conn* conn, uint64_t transfer_id, uint32_t attempt,
                         const absl::Status& status) {
  if (conn->rejected_id == transfer_id && conn->rejected_attempt == attempt) return;
  conn->rejected_id = transfer_id;
  conn->rejected_attempt = attempt;
  Send(conn, wire::FrameType::kResult, wire::EncodeOutcome({transfer_id, attempt, status}))
      .IgnoreError();
}

absl::Status TcpReceiver::ReadMessage(Conn* conn, wire::Prefix* prefix, std::string* meta,
                                      bool handshake, int64_t* extra) {
  uint8_t raw[wire::kPrefixBytes];
  absl::Status s = handshake ? ReadBytesBy(conn->fd.get(), raw, sizeof raw, options_.io_timeout,
                                           conn->handshake_deadline)
                             : ReadBytes(conn->fd.get(), raw, sizeof raw, options_.io_timeout,
                                         absl::InfiniteDuration());  // idle between messages
  if (!s.ok()) return s;
  absl::StatusOr<wire::Prefix> p = wire::DecodePrefix(raw);
  if (!p.ok()) return p.status();
  if (handshake && p->meta_len > options_.limits.max_handshake_message) {
    return absl::DataLossError(absl::StrCat("kv transfer handshake message of ", p->meta_len,
                                            " bytes (at most ",
                                            options_.limits.max_handshake_message, ")"));
  }
  if (!handshake && p->meta_len > kMessageAllowance) {
    const int64_t more = p->meta_len - kMessageAllowance;
    if (!Charge(more)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("kv transfer metadata of ", p->meta_len,
                       " bytes does not fit the receiver's memory budget"));
    }
    *extra += more;
  }
  *prefix = *p;
  meta->resize(p->meta_len);
  // The metadata comes whole within io_timeout (or the handshake's deadline), not a byte at a
  // time for ever.
  s = ReadBytesBy(conn->fd.get(), meta->data(), meta->size(), options_.io_timeout,
                  handshake ? conn->handshake_deadline : absl::Now() + options_.io_timeout);
  if (!s.ok()) return s;
  return wire::VerifyMeta(*prefix, *meta);
}

absl::Status TcpReceiver::Handshake(Conn* conn) {
  wire::Prefix prefix;
  std::string hello_meta;
  absl::Status s = ReadMessage(conn, &prefix, &hello_meta, /*handshake=*/true);
  if (!s.ok()) return s;
  wire::Hello hello;
  if (prefix.type != wire::FrameType::kHello) {
    return absl::DataLossError("first kv transfer message is not HELLO");
  }
  s = wire::DecodeHello(hello_meta, &hello);
  if (s.ok() && hello.magic != wire::kHelloMagic) s = absl::DataLossError("bad HELLO magic");
  // With a secret, nothing about this receiver (its layout included) is told before the peer
  // proved it: the layout is checked after the challenge, its mismatch told to a peer that
  // holds the secret.
  std::string receiver_nonce, sender_nonce;
  if (s.ok() && !options_.secret.empty()) {
    s = Authenticate(conn, hello_meta, &receiver_nonce, &sender_nonce);
  }
  if (s.ok()) s = CheckKvLayoutCompatible(options_.layout, hello.layout);
  // Authenticated (or no secret): its buffers for the connection's life.
  if (s.ok()) {
    if (Charge(kConnectionChargeBytes)) {
      conn->charged += kConnectionChargeBytes;
    } else {
      s = absl::ResourceExhaustedError("the kv receiver's connection memory budget is spent");
      NoteRefused(KvRefusal::kMemory, conn->peer, s);
    }
  }
  if (!s.ok()) {
    if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) return s;  // the peer went away
    if (!absl::IsResourceExhausted(s)) {
      core_->counters().handshakes_refused.fetch_add(1, std::memory_order_relaxed);
      ReportRefused(options_.hooks, TransferDirection::kReceive, s);
      TLOG(WARNING) << "kv transfer: refusing " << conn->peer << ": " << s.message();
    }
    const std::string refuse =
        wire::MakeFrame(wire::FrameType::kRefuse, 0, wire::EncodeOutcome({0, 0, s}));
    WriteBytesBy(conn->fd.get(), refuse.data(), refuse.size(), options_.io_timeout,
                 conn->handshake_deadline)
        .IgnoreError();
    return s;
  }
  conn->binding = receiver_nonce + sender_nonce;
  wire::Welcome welcome;
  welcome.incarnation = incarnation_;
  welcome.layout = options_.layout;
  if (!options_.secret.empty()) {
    welcome.proof =
        ReceiverProof(options_.secret, sender_nonce, receiver_nonce, wire::EncodeWelcome(welcome));
  }
  const std::string frame =
      wire::MakeFrame(wire::FrameType::kWelcome, 0, wire::EncodeWelcome(welcome));
  s = WriteBytesBy(conn->fd.get(), frame.data(), frame.size(), options_.io_timeout,
                   conn->handshake_deadline);
  if (s.ok()) core_->counters().connects.fetch_add(1, std::memory_order_relaxed);
  return s;
}

absl::Status TcpReceiver::Authenticate(Conn* conn, const std::string& hello_meta,
                                       std::string* receiver_nonce, std::string* sender_nonce) {
  absl::StatusOr<std::string> nonce = NewNonce();
  if (!nonce.ok()) return nonce.status();
  *receiver_nonce = *nonce;
  const std::string challenge =
      wire::MakeFrame(wire::FrameType::kChallenge, 0, wire::EncodeChallenge({*receiver_nonce}));
  absl::Status s = WriteBytesBy(conn->fd.get(), challenge.data(), challenge.size(),
                                options_.io_timeout, conn->handshake_deadline);
  if (!s.ok()) return s;
  wire::Prefix prefix;
  std::string meta;
  s = ReadMessage(conn, &prefix, &meta, /*handshake=*/true);
  if (!s.ok()) return s;
  if (prefix.type != wire::FrameType::kAuth) {
    return absl::UnauthenticatedError(
        absl::StrCat("kv transfer authentication failed: the sender answered the challenge with ",
                     wire::FrameTypeName(prefix.type), " instead of AUTH"));
  }
  wire::Auth auth;
  s = wire::DecodeAuth(meta, &auth);
  if (!s.ok()) return s;
  if (auth.proof.empty()) {
    return absl::UnauthenticatedError(
        "kv transfer authentication failed: the sender has no shared secret "
        "(--kv-secret-file) and this receiver requires one");
  }
  if (auth.nonce.size() != kAuthNonceBytes ||
      !ProofMatches(auth.proof,
                    SenderProof(options_.secret, *receiver_nonce, auth.nonce, hello_meta))) {
    return absl::UnauthenticatedError(
        "kv transfer authentication failed: the sender's proof does not match this receiver's "
        "shared secret (another --kv-secret-file?)");
  }
  *sender_nonce = auth.nonce;
  return absl::OkStatus();
}

void TcpReceiver::Serve(const std::shared_ptr<Conn>& conn) {
  pthread_setname_np(pthread_self(), "kvt-recv-conn");
  absl::Status s = Handshake(conn.get());
  bool handshaken = s.ok();
  if (!s.ok() && absl::IsDeadlineExceeded(s)) {
    NoteRefused(
        KvRefusal::kHandshakeTimeout, conn->peer,
        absl::DeadlineExceededError(absl::StrCat(
            "its handshake took longer than ", absl::FormatDuration(options_.handshake_timeout))));
  }
  while (s.ok()) {
    wire::Prefix prefix;
    std::string meta;
    int64_t extra = 0;  // metadata beyond the connection's allowance, charged for this message
    s = ReadMessage(conn.get(), &prefix, &meta, /*handshake=*/false, &extra);
    if (!s.ok()) {
      Release(extra);
      if (absl::IsResourceExhausted(s)) NoteRefused(KvRefusal::kMemory, conn->peer, s);
      break;
    }
    switch (prefix.type) {
      case wire::FrameType::kBegin:
        s = HandleBegin(conn, meta);
        break;
      case wire::FrameType::kData:
        s = HandleData(conn.get(), prefix, meta);
        break;
      case wire::FrameType::kFinish: {
        wire::Finish f;
        s = wire::DecodeFinish(meta, &f);
        if (!s.ok()) break;
        absl::Status r = core_->Finish(conn->owner, f.transfer_id, f.attempt, f.frames, f.bytes,
                                       std::move(f.trailer));
        if (!r.ok()) Reject(conn.get(), f.transfer_id, f.attempt, r);
        break;
      }
      case wire::FrameType::kAbort: {
        wire::Outcome a;
        s = wire::DecodeOutcome(meta, &a);
        if (!s.ok()) break;
        core_->Abort(conn->owner, a.transfer_id, a.attempt,
                     absl::Status(a.status.ok() ? absl::StatusCode::kAborted : a.status.code(),
                                  absl::StrCat("sender aborted: ", a.status.message())));
        break;
      }
      default:
        s = absl::DataLossError(
            absl::StrCat("unexpected kv transfer message ", wire::FrameTypeName(prefix.type)));
    }
    meta = std::string();  // its bytes go back before the charge does
    Release(extra);
  }
  if (handshaken) {
    if (!stopping_) {
      core_->counters().connections_lost.fetch_add(1, std::memory_order_relaxed);
      TLOG(DEBUG) << "kv transfer connection from " << conn->peer << " ended: " << s.message();
    }
    core_->FailOwner(conn->owner,
                     absl::UnavailableError(absl::StrCat("kv transfer connection from ", conn->peer,
                                                         " lost: ", s.message())));
  }
  conn->fd.Shutdown();
  conn->scratch = std::vector<uint8_t>();
  limiter_.Leave(conn->peer_host, conn->charged);
  conn->charged = 0;
  conn->finished = true;
}

absl::Status TcpReceiver::HandleBegin(const std::shared_ptr<Conn>& conn, const std::string& meta) {
  wire::Begin b;
  absl::Status s = wire::DecodeBegin(meta, &b);
  if (!s.ok()) return s;
  conn->rejected_attempt = -1;  // a BEGIN is a new try: its refusal is always told
  if (b.incarnation != incarnation_) {
    Reject(conn.get(), b.transfer_id, b.attempt,
           absl::FailedPreconditionError(absl::StrCat("receiver incarnation is ", incarnation_,
                                                      ", transfer was reserved under ",
                                                      b.incarnation)));
    return absl::OkStatus();
  }
  ReceiverCore::AttemptStart start;
  start.transfer_id = b.transfer_id;
  start.attempt = b.attempt;
  start.dst_blocks = std::move(b.dst_blocks);
  start.owner = conn->owner;
  start.deadline =
      b.deadline_ms < 0 ? absl::InfiniteFuture() : absl::Now() + absl::Milliseconds(b.deadline_ms);
  start.proof = std::move(b.proof);
  start.binding = conn->binding;
  std::weak_ptr<Conn> weak = conn;
  const uint64_t id = b.transfer_id;
  const uint32_t attempt = b.attempt;
  absl::Status r = core_->Begin(std::move(start), [this, weak, id,
                                                   attempt](const absl::Status& st) {
    if (std::shared_ptr<Conn> c = weak.lock()) {
      Send(c.get(), wire::FrameType::kResult, wire::EncodeOutcome({id, attempt, st})).IgnoreError();
    }
  });
  if (!r.ok()) Reject(conn.get(), id, attempt, r);
  return absl::OkStatus();
}

absl::Status TcpReceiver::Drain(Conn* conn, uint64_t bytes) {
  std::vector<uint8_t>& scratch = conn->scratch;
  if (scratch.empty()) scratch.resize(wire::kScratchBytes);
  while (bytes > 0) {
    const size_t n = std::min<uint64_t>(bytes, scratch.size());
    absl::Status s = ReadBytes(conn->fd.get(), scratch.data(), n, options_.io_timeout);
    if (!s.ok()) return s;
    bytes -= n;
  }
  return absl::OkStatus();
}

absl::Status TcpReceiver::HandleData(Conn* conn, const wire::Prefix& prefix,
                                     const std::string& meta) {
  wire::DataMeta d;
  absl::Status s = wire::DecodeDataMeta(meta, &d);
  if (!s.ok()) return s;
  const bool checksummed = (prefix.flags & wire::kFlagChecksum) != 0;
  const uint64_t wire_bytes = d.payload_len + (checksummed ? sizeof(uint32_t) : 0);
  const size_t region = options_.layout.region_bytes();
  if (d.payload_len != d.blocks.size() * region) {  // a broken peer: stop trusting the stream
    return absl::DataLossError(absl::StrCat("DATA payload of ", d.payload_len, " bytes for ",
                                            d.blocks.size(), " regions of ", region, " bytes"));
  }
  bool reported = false;
  absl::StatusOr<ReceiverCore::Ticket> ticket =
      core_->AdmitData(conn->owner, d.transfer_id, d.attempt, d.layer, d.blocks, &reported);
  if (!ticket.ok()) {
    if (!reported) Reject(conn, d.transfer_id, d.attempt, ticket.status());
    return Drain(conn, wire_bytes);
  }
  const FaultInjector::Decision fault = faults_.Next();
  if (fault.any()) core_->counters().faults_injected.fetch_add(1, std::memory_order_relaxed);
  if (fault.delay > absl::ZeroDuration()) absl::SleepFor(fault.delay);
  if (fault.close) {
    core_->EndData(*ticket, absl::UnavailableError("fault injection closed the connection"));
    return absl::UnavailableError("fault injection closed the connection");
  }
  if (fault.drop) return Drain(conn, wire_bytes);  // never arrived: FINISH finds it missing

  // Payload straight into the regions; each piece is checksummed right after it landed.
  std::vector<uint8_t>& scratch = conn->scratch;
  if (scratch.empty()) scratch.resize(wire::kScratchBytes);
  uint32_t crc = 0;
  uint64_t offset = 0;
  const uint64_t corrupt_at = fault.corrupt ? fault.corrupt_position % d.payload_len : ~0ull;
  IoHooks hooks;
  hooks.mu = core_->io_mutex(*ticket);
  hooks.valid = [&] { return core_->Writable(*ticket); };
  hooks.scratch = scratch.data();
  hooks.scratch_len = scratch.size();
  if (checksummed || fault.corrupt) {
    hooks.on_bytes = [&](uint8_t* p, size_t n) {
      if (corrupt_at >= offset && corrupt_at < offset + n) p[corrupt_at - offset] ^= 0x5a;
      offset += n;
      if (checksummed) crc = Crc32c(crc, p, n);
    };
  }
  hooks.max_bytes_per_call = wire::kBytesPerCall;
  IovCursor cur;
  for (uint8_t* r : ticket->regions) cur.Add(r, region);
  s = ReadAll(conn->fd.get(), &cur, options_.io_timeout, &hooks);
  uint32_t sent_crc = 0;
  if (s.ok() && checksummed) {
    s = ReadBytes(conn->fd.get(), &sent_crc, sizeof sent_crc, options_.io_timeout);
  }
  if (!s.ok()) {
    core_->EndData(*ticket, s);
    return s;
  }
  absl::Status verdict;
  if (checksummed && crc != sent_crc) {
    core_->counters().checksum_failures.fetch_add(1, std::memory_order_relaxed);
    verdict = absl::DataLossError(absl::StrCat("checksum mismatch in layer ", d.layer,
                                               " of transfer ", d.transfer_id, " attempt ",
                                               d.attempt, " (", d.blocks.size(), " regions)"));
  }
  core_->EndData(*ticket, verdict);
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer::tcp
