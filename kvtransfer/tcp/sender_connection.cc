#include "kvtransfer/tcp/sender_connection.h"

#include <poll.h>
#include <pthread.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "kvtransfer/auth.h"
#include "kvtransfer/crc32c.h"
#include "kvtransfer/tcp/wire.h"

namespace tandem::kvtransfer::tcp {
namespace {

absl::Status ReadReply(int fd, absl::Time deadline, wire::Prefix* prefix, std::string* meta) {
  uint8_t raw[wire::kPrefixBytes];
  const absl::Duration left = std::max(deadline - absl::Now(), absl::Milliseconds(1));
  absl::Status s = ReadBytes(fd, raw, sizeof raw, left, left);
  if (!s.ok()) return s;
  absl::StatusOr<wire::Prefix> p = wire::DecodePrefix(raw);
  if (!p.ok()) return p.status();
  *prefix = *p;
  meta->resize(p->meta_len);
  s = ReadBytes(fd, meta->data(), meta->size(),
                std::max(deadline - absl::Now(), absl::Milliseconds(1)));
  if (!s.ok()) return s;
  return wire::VerifyMeta(*prefix, *meta);
}

absl::Status WriteFrame(int fd, wire::FrameType type, const std::string& meta,
                        absl::Time deadline) {
  const std::string frame = wire::MakeFrame(type, 0, meta);
  return WriteBytes(fd, frame.data(), frame.size(),
                    std::max(deadline - absl::Now(), absl::Milliseconds(1)));
}

}  // namespace

absl::StatusOr<std::shared_ptr<SenderConnection>> SenderConnection::Connect(
    const std::string& endpoint, const ConnectionOptions& options, absl::Duration timeout,
    KvRegionAccess* access, FaultInjector* faults, StatsCounters* counters, Callbacks callbacks) {
  const absl::Time deadline = absl::Now() + timeout;
  auto unreachable = [&](const absl::Status& s) {
    return absl::Status(absl::IsDeadlineExceeded(s) ? s.code() : absl::StatusCode::kUnavailable,
                        absl::StrCat("kv transfer peer ", endpoint, " unreachable: ", s.message()));
  };
  absl::StatusOr<Fd> fd = tcp::Connect(endpoint, timeout);
  if (!fd.ok()) return unreachable(fd.status());
  ConfigureSocket(fd->get(), options.io_timeout);

  wire::Hello hello;
  hello.layout = options.layout;
  const std::string hello_meta = wire::EncodeHello(hello);
  absl::Status s = WriteFrame(fd->get(), wire::FrameType::kHello, hello_meta, deadline);
  if (!s.ok()) return unreachable(s);
  wire::Prefix prefix;
  std::string meta;
  s = ReadReply(fd->get(), deadline, &prefix, &meta);
  if (!s.ok()) return unreachable(s);
  auto unauthenticated = [&](const std::string& why) {
    counters->handshakes_refused.fetch_add(1, std::memory_order_relaxed);
    if (options.hooks != nullptr) {
      options.hooks->ConnectionRefused(TransferDirection::kSend, TransferFailure::kUnauthenticated);
    }
    return absl::UnauthenticatedError(
        absl::StrCat("kv transfer peer ", endpoint, " failed authentication: ", why));
  };
  std::string sender_nonce, receiver_nonce;
  if (prefix.type == wire::FrameType::kChallenge) {
    // The receiver has a secret: answer with a proof (empty without one; it refuses that).
    wire::Challenge challenge;
    s = wire::DecodeChallenge(meta, &challenge);
    if (!s.ok()) return unreachable(s);
    receiver_nonce = challenge.nonce;
    if (receiver_nonce.size() != kAuthNonceBytes) {
      return unauthenticated(absl::StrCat("its challenge has a nonce of ", receiver_nonce.size(),
                                          " bytes, not ", kAuthNonceBytes));
    }
    wire::Auth auth;
    if (!options.secret.empty()) {
      absl::StatusOr<std::string> nonce = NewNonce();
      if (!nonce.ok()) return nonce.status();
      sender_nonce = auth.nonce = *nonce;
      auth.proof = SenderProof(options.secret, receiver_nonce, sender_nonce, hello_meta);
    }
    s = WriteFrame(fd->get(), wire::FrameType::kAuth, wire::EncodeAuth(auth), deadline);
    if (!s.ok()) return unreachable(s);
    s = ReadReply(fd->get(), deadline, &prefix, &meta);
    if (!s.ok()) return unreachable(s);
  }
  if (prefix.type == wire::FrameType::kRefuse) {
    wire::Outcome refuse;
    s = wire::DecodeOutcome(meta, &refuse);
    if (!s.ok()) return unreachable(s);
    counters->handshakes_refused.fetch_add(1, std::memory_order_relaxed);
    // Refused for a limit of the receiver (its memory budget): try again later; else the
    // secret (UNAUTHENTICATED) or the layout (FAILED_PRECONDITION).
    const absl::StatusCode code =
        absl::IsUnauthenticated(refuse.status) || absl::IsResourceExhausted(refuse.status)
            ? refuse.status.code()
            : absl::StatusCode::kFailedPrecondition;
    return absl::Status(code, absl::StrCat("kv transfer peer ", endpoint,
                                           " refused the connection: ", refuse.status.message()));
  }
  if (prefix.type != wire::FrameType::kWelcome) {
    return unreachable(absl::DataLossError(
        absl::StrCat("handshake answered with ", wire::FrameTypeName(prefix.type))));
  }
  wire::Welcome welcome;
  s = wire::DecodeWelcome(meta, &welcome);
  if (!s.ok()) return unreachable(s);
  if (!options.secret.empty()) {
    // The receiver must prove the secret too: KV never goes to an impostor.
    if (receiver_nonce.empty()) {
      return unauthenticated(
          "it did not challenge this sender (no shared secret configured there: "
          "--kv-secret-file), and this sender requires one");
    }
    wire::Welcome unsigned_welcome = welcome;
    unsigned_welcome.proof.clear();
    if (!ProofMatches(welcome.proof, ReceiverProof(options.secret, sender_nonce, receiver_nonce,
                                                   wire::EncodeWelcome(unsigned_welcome)))) {
      return unauthenticated("its proof of the shared secret is wrong (another --kv-secret-file?)");
    }
  }
  s = CheckKvLayoutCompatible(options.layout, welcome.layout);
  if (!s.ok()) {
    counters->handshakes_refused.fetch_add(1, std::memory_order_relaxed);
    if (options.hooks != nullptr) {
      options.hooks->ConnectionRefused(TransferDirection::kSend, TransferFailure::kIncompatible);
    }
    return absl::FailedPreconditionError(
        absl::StrCat("kv transfer peer ", endpoint, " is incompatible: ", s.message()));
  }
  counters->connects.fetch_add(1, std::memory_order_relaxed);
  std::shared_ptr<SenderConnection> c(new SenderConnection(endpoint, options, std::move(*fd),
                                                           welcome.incarnation, access, faults,
                                                           counters, std::move(callbacks)));
  c->binding_ = receiver_nonce + sender_nonce;
  c->writer_ = std::thread([p = c.get()] { p->WriterLoop(); });
  c->reader_ = std::thread([p = c.get()] { p->ReaderLoop(); });
  return c;
}

SenderConnection::SenderConnection(std::string endpoint, const ConnectionOptions& options, Fd fd,
                                   uint64_t incarnation, KvRegionAccess* access,
                                   FaultInjector* faults, StatsCounters* counters,
                                   Callbacks callbacks)
    : endpoint_(std::move(endpoint)),
      options_(options),
      fd_(std::move(fd)),
      incarnation_(incarnation),
      access_(access),
      faults_(faults),
      counters_(counters),
      callbacks_(std::move(callbacks)),
      scratch_(wire::kScratchBytes, 0) {}

SenderConnection::~SenderConnection() { Close(); }

bool SenderConnection::usable() const {
  if (failed_) return false;
  pollfd p{fd_.get(), POLLRDHUP, 0};
  return poll(&p, 1, 0) == 0 || (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0;
}

bool SenderConnection::drained() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.empty() && !busy_;
}

void SenderConnection::Send(SenderWork work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_ || closing_) return;
    queue_.push_back(std::move(work));
  }
  cv_.notify_one();
}

void SenderConnection::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  cv_.notify_one();
  if (writer_.joinable()) writer_.join();
  fd_.Shutdown();
  if (reader_.joinable()) reader_.join();
}

void SenderConnection::Fail(const absl::Status& status) {
  if (failed_.exchange(true)) return;
  fd_.Shutdown();
  bool closing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing = closing_;
    queue_.clear();
  }
  cv_.notify_one();
  if (!closing && callbacks_.on_failed) callbacks_.on_failed(this, status);
}

void SenderConnection::WriterLoop() {
  pthread_setname_np(pthread_self(), "kvt-send-write");
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return !queue_.empty() || closing_ || failed_; });
    if (failed_ || queue_.empty()) return;
    SenderWork work = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    absl::Status s = Write(work);
    work = SenderWork();  // drop the transfer reference outside the lock
    if (!s.ok()) {
      Fail(absl::Status(s.code(), absl::StrCat("kv transfer connection to ", endpoint_,
                                               " failed: ", s.message())));
    }
    lock.lock();
    busy_ = false;
  }
}

void SenderConnection::ReaderLoop() {
  pthread_setname_np(pthread_self(), "kvt-send-read");
  absl::Status s;
  while (s.ok()) {
    uint8_t raw[wire::kPrefixBytes];
    s = ReadBytes(fd_.get(), raw, sizeof raw, options_.io_timeout, absl::InfiniteDuration());
    if (!s.ok()) break;
    absl::StatusOr<wire::Prefix> p = wire::DecodePrefix(raw);
    if (!p.ok()) {
      s = p.status();
      break;
    }
    std::string meta(p->meta_len, '\0');
    s = ReadBytes(fd_.get(), meta.data(), meta.size(), options_.io_timeout);
    if (s.ok()) s = wire::VerifyMeta(*p, meta);
    if (!s.ok()) break;
    if (p->type != wire::FrameType::kResult) {
      s = absl::DataLossError(
          absl::StrCat("unexpected ", wire::FrameTypeName(p->type), " from the receiver"));
      break;
    }
    wire::Outcome result;
    s = wire::DecodeOutcome(meta, &result);
    if (s.ok() && callbacks_.on_result) {
      callbacks_.on_result(this, result.transfer_id, result.attempt, result.status);
    }
  }
  Fail(absl::UnavailableError(
      absl::StrCat("kv transfer connection to ", endpoint_, " lost: ", s.message())));
}

absl::Status SenderConnection::WriteSmall(uint16_t type, const std::string& meta) {
  const std::string frame = wire::MakeFrame(static_cast<wire::FrameType>(type), 0, meta);
  return WriteBytes(fd_.get(), frame.data(), frame.size(), options_.io_timeout);
}

absl::Status SenderConnection::Write(const SenderWork& work) {
  SenderTransfer* t = work.transfer.get();
  const TransferTarget& target = t->target;
  switch (work.kind) {
    case SenderWork::Kind::kBegin: {
      // Sent even when the transfer already ended, so that the ABORT behind it reaches a
      // receiver that knows the attempt and reports it.
      wire::Begin b;
      b.transfer_id = target.transfer_id;
      b.attempt = target.attempt;
      b.incarnation = target.incarnation;
      b.deadline_ms =
          target.deadline == absl::InfiniteFuture()
              ? -1
              : std::max<int64_t>(0, absl::ToInt64Milliseconds(target.deadline - absl::Now()));
      b.dst_blocks = target.dst_blocks;
      if (!target.transfer_key.empty()) {
        b.proof = BeginProof(target.transfer_key, binding_, b.transfer_id, b.attempt, b.dst_blocks);
      }
      return WriteSmall(static_cast<uint16_t>(wire::FrameType::kBegin), wire::EncodeBegin(b));
    }
    case SenderWork::Kind::kData:
      return WriteData(work);
    case SenderWork::Kind::kFinish: {
      if (t->Ended()) return absl::OkStatus();
      wire::Finish f;
      f.transfer_id = target.transfer_id;
      f.attempt = target.attempt;
      f.frames = t->frames_sent;
      f.bytes = t->bytes_sent;
      f.trailer = work.trailer;
      return WriteSmall(static_cast<uint16_t>(wire::FrameType::kFinish), wire::EncodeFinish(f));
    }
    case SenderWork::Kind::kAbort:
      return WriteSmall(static_cast<uint16_t>(wire::FrameType::kAbort),
                        wire::EncodeOutcome({target.transfer_id, target.attempt, work.status}));
  }
  return absl::OkStatus();
}

absl::Status SenderConnection::WriteData(const SenderWork& item) {
  SenderTransfer* t = item.transfer.get();
  if (t->Ended()) return absl::OkStatus();  // skip its queued layers
  const size_t region = options_.layout.region_bytes();
  FaultInjector::Decision fault;
  if (faults_ != nullptr && faults_->enabled()) {
    fault = faults_->Next();
    if (fault.any()) counters_->faults_injected.fetch_add(1, std::memory_order_relaxed);
    if (fault.delay > absl::ZeroDuration()) absl::SleepFor(fault.delay);
    if (fault.close) return absl::UnavailableError("fault injection closed the connection");
  }
  wire::DataMeta d;
  d.transfer_id = t->target.transfer_id;
  d.attempt = t->target.attempt;
  d.layer = static_cast<uint32_t>(item.layer);
  d.payload_len = item.count * region;
  d.blocks.assign(t->target.dst_blocks.begin() + item.first,
                  t->target.dst_blocks.begin() + item.first + item.count);
  std::vector<const uint8_t*> regions(item.count);
  // The checksum is taken from the bytes right after each send copied them (still in cache);
  // with a corruption fault, from the intact regions up front, since a copy goes out instead.
  uint32_t crc = 0;
  bool crc_while_sending = options_.checksum;
  {
    std::lock_guard<std::mutex> lock(t->io_mu);
    if (!t->readable) return absl::OkStatus();
    for (size_t i = 0; i < item.count; ++i) {
      regions[i] = access_->Region(item.layer, t->src_blocks[item.first + i]);
    }
    if (fault.corrupt && item.count > 0) {  // flip a byte of a copy: the KV pool stays intact
      if (options_.checksum) {
        for (const uint8_t* r : regions) crc = Crc32c(crc, r, region);
        crc_while_sending = false;
      }
      const size_t k = fault.corrupt_position % item.count;
      corrupted_.assign(regions[k], regions[k] + region);
      corrupted_[(fault.corrupt_position >> 20) % region] ^= 0x5a;
      regions[k] = corrupted_.data();
    }
  }
  t->frames_sent += 1;
  t->bytes_sent += d.payload_len;
  if (fault.drop) return absl::OkStatus();  // lost on the way: the receiver's FINISH check sees it

  const std::string head = wire::MakeFrame(
      wire::FrameType::kData, options_.checksum ? wire::kFlagChecksum : 0, wire::EncodeDataMeta(d));
  absl::Status s = WriteBytes(fd_.get(), head.data(), head.size(), options_.io_timeout);
  if (!s.ok()) return s;
  IovCursor cur;
  for (const uint8_t* r : regions) cur.Add(r, region);
  IoHooks hooks;
  hooks.mu = &t->io_mu;
  hooks.valid = [t] { return t->readable; };
  hooks.scratch = scratch_.data();
  hooks.scratch_len = scratch_.size();
  if (crc_while_sending) {
    hooks.on_bytes = [&crc](uint8_t* p, size_t n) { crc = Crc32c(crc, p, n); };
  }
  hooks.max_bytes_per_call = wire::kBytesPerCall;
  s = WriteAll(fd_.get(), &cur, options_.io_timeout, &hooks);
  if (!s.ok()) return s;
  if (options_.checksum) {
    s = WriteBytes(fd_.get(), &crc, sizeof crc, options_.io_timeout);
    if (!s.ok()) return s;
  }
  counters_->frames.fetch_add(1, std::memory_order_relaxed);
  counters_->bytes.fetch_add(d.payload_len, std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer::tcp
