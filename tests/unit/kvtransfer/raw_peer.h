#pragma once

// A hand-driven peer of a tcp KV receiver, speaking the wire protocol (kvtransfer/tcp/wire.h)
// message by message: for tests of what a buggy, malicious, silent or stalled sender can do.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cluster/transfer_key.h"
#include "gtest/gtest.h"
#include "kvtransfer/auth.h"
#include "kvtransfer/crc32c.h"
#include "kvtransfer/tcp/socket.h"
#include "kvtransfer/tcp/wire.h"
#include "kvtransfer/transport.h"

namespace tandem::kvtransfer::testing {

inline constexpr absl::Duration kIo = absl::Seconds(5);

class RawPeer {
 public:
  using FrameType = wire::FrameType;

  explicit RawPeer(tcp::Fd fd) : fd_(std::move(fd)) {}
  static RawPeer Connect(const std::string& endpoint) {
    auto fd = tcp::Connect(endpoint, kIo);
    EXPECT_TRUE(fd.ok()) << fd.status();
    if (!fd.ok()) return RawPeer(tcp::Fd());
    tcp::ConfigureSocket(fd->get(), kIo);
    return RawPeer(std::move(*fd));
  }
  void Send(FrameType type, const std::string& meta, const std::string& payload = "",
            uint16_t flags = 0) {
    std::string frame = wire::MakeFrame(type, flags, meta) + payload;
    ASSERT_TRUE(tcp::WriteBytes(fd_.get(), frame.data(), frame.size(), kIo).ok());
  }
  void SendRaw(const std::string& bytes) {
    ASSERT_TRUE(tcp::WriteBytes(fd_.get(), bytes.data(), bytes.size(), kIo).ok());
  }
  // The next message, or the error that ended the stream.
  absl::StatusOr<std::pair<FrameType, std::string>> Read(absl::Duration timeout = kIo) {
    uint8_t raw[wire::kPrefixBytes];
    absl::Status s = tcp::ReadBytes(fd_.get(), raw, sizeof raw, timeout, timeout);
    if (!s.ok()) return s;
    auto p = wire::DecodePrefix(raw);
    if (!p.ok()) return p.status();
    std::string meta(p->meta_len, '\0');
    s = tcp::ReadBytes(fd_.get(), meta.data(), meta.size(), timeout);
    if (!s.ok()) return s;
    return std::make_pair(p->type, meta);
  }
  absl::Status ReadResult(uint64_t* id = nullptr, uint32_t* attempt = nullptr,
                          absl::Duration timeout = kIo) {
    auto m = Read(timeout);
    if (!m.ok()) return absl::InternalError(std::string(m.status().message()));
    EXPECT_EQ(m->first, FrameType::kResult);
    wire::Outcome o;
    EXPECT_TRUE(wire::DecodeOutcome(m->second, &o).ok());
    if (id) *id = o.transfer_id;
    if (attempt) *attempt = o.attempt;
    return o.status;
  }
  // HELLO [-> CHALLENGE -> AUTH with `secret`] -> WELCOME; returns the incarnation (0 after
  // anything else, whose status goes to `*refused` when given).
  uint64_t Handshake(const KvLayout& layout, const std::string& secret = "",
                     absl::Status* refused = nullptr) {
    wire::Hello h;
    h.layout = layout;
    const std::string hello = wire::EncodeHello(h);
    Send(FrameType::kHello, hello);
    auto m = Read();
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return 0;
    if (m->first == FrameType::kChallenge) {
      wire::Challenge c;
      EXPECT_TRUE(wire::DecodeChallenge(m->second, &c).ok());
      wire::Auth a;
      a.nonce = std::string(kAuthNonceBytes, 's');
      a.proof = secret.empty() ? std::string(kAuthMacBytes, 'x')
                               : SenderProof(secret, c.nonce, a.nonce, hello);
      binding_ = c.nonce + a.nonce;
      Send(FrameType::kAuth, wire::EncodeAuth(a));
      m = Read();
      EXPECT_TRUE(m.ok()) << m.status();
      if (!m.ok()) return 0;
    }
    if (m->first != FrameType::kWelcome) {
      wire::Outcome o;
      if (refused != nullptr && wire::DecodeOutcome(m->second, &o).ok()) *refused = o.status;
      return 0;
    }
    wire::Welcome w;
    EXPECT_TRUE(wire::DecodeWelcome(m->second, &w).ok());
    return w.incarnation;
  }
  // BEGIN, proving the transfer's `key` (none when empty; its attempt's key, as the router hands
  // it out) over this connection's handshake nonces.
  void Begin(uint64_t id, uint32_t attempt, uint64_t incarnation, const std::vector<int32_t>& dst,
             const std::string& key = "", int64_t deadline_ms = -1) {
    wire::Begin b{id, attempt, incarnation, deadline_ms, dst};
    if (!key.empty()) {
      b.proof = BeginProof(TransferAttemptKey(key, attempt), binding_, id, attempt, dst);
    }
    Send(FrameType::kBegin, wire::EncodeBegin(b));
  }
  void SendData(uint64_t id, uint32_t attempt, uint32_t layer, const std::vector<int32_t>& blocks,
                const std::string& payload, bool good_crc = true) {
    wire::DataMeta d;
    d.transfer_id = id;
    d.attempt = attempt;
    d.layer = layer;
    d.blocks = blocks;
    d.payload_len = payload.size();
    const uint32_t crc = Crc32c(0, payload.data(), payload.size()) ^ (good_crc ? 0 : 1);
    Send(FrameType::kData, wire::EncodeDataMeta(d),
         payload + std::string(reinterpret_cast<const char*>(&crc), sizeof crc),
         wire::kFlagChecksum);
  }
  // True when the peer closed the connection within `timeout`.
  bool ClosedWithin(absl::Duration timeout) {
    auto m = Read(timeout);
    return !m.ok() && absl::IsUnavailable(m.status());
  }
  int fd() const { return fd_.get(); }
  const std::string& binding() const { return binding_; }

 private:
  tcp::Fd fd_;
  std::string binding_;  // the handshake's nonces (receiver's, sender's)
};

}  // namespace tandem::kvtransfer::testing
