// Fuzzes the TCP transport's message decoders (kvtransfer/tcp/wire.h), which read what any peer
// sends. Byte 0 (mod 10) picks the decoder, the rest is the message. Checked: decoding never reads
// out of bounds; a decoded message encodes to bytes that decode to the same message (and a prefix
// to the very same 16 bytes); a decoded HELLO / WELCOME layout can be compared, validated and
// printed.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/cluster/kv_transfer_layout.h"
#include "kvtransfer/tcp/wire.h"

namespace w = tandem::kvtransfer::wire;
using tandem::kvtransfer::KvLayout;

#define FUZZ_CHECK(cond)                                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

namespace {

bool SameLayout(const KvLayout& a, const KvLayout& b) {
  return a.model_id == b.model_id && a.num_layers == b.num_layers &&
         a.num_kv_heads == b.num_kv_heads && a.head_dim == b.head_dim &&
         a.block_size == b.block_size && a.kv_dtype == b.kv_dtype &&
         a.protocol_version == b.protocol_version;
}

void UseLayout(const KvLayout& peer) {
  KvLayout local;
  local.model_id = "stories260k";
  local.num_layers = 5;
  local.num_kv_heads = 4;
  local.head_dim = 8;
  local.block_size = 16;
  (void)tandem::CheckKvLayoutCompatible(local, peer).message().size();
  (void)tandem::ValidateKvLayout(peer).ok();
  (void)tandem::KvLayoutDebugString(peer).size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  // A private copy of exactly the message, so reads past its end are caught.
  const std::string meta(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 10) {
    case 0: {
      if (meta.size() < w::kPrefixBytes) return 0;
      std::vector<uint8_t> raw(meta.begin(), meta.begin() + w::kPrefixBytes);
      auto p = w::DecodePrefix(raw.data());
      if (!p.ok()) return 0;
      FUZZ_CHECK(p->meta_len <= w::kMaxMetaBytes);
      uint8_t again[w::kPrefixBytes];
      w::EncodePrefix(*p, again);
      FUZZ_CHECK(std::memcmp(again, raw.data(), w::kPrefixBytes) == 0);
      (void)w::VerifyMeta(*p, meta.substr(w::kPrefixBytes)).ok();
      (void)w::FrameTypeName(p->type);
      break;
    }
    case 1: {
      w::Hello m, n;
      if (!w::DecodeHello(meta, &m).ok()) return 0;
      FUZZ_CHECK(w::DecodeHello(w::EncodeHello(m), &n).ok());
      FUZZ_CHECK(m.magic == n.magic && SameLayout(m.layout, n.layout));
      UseLayout(m.layout);
      break;
    }
    case 2: {
      w::Welcome m, n;
      if (!w::DecodeWelcome(meta, &m).ok()) return 0;
      FUZZ_CHECK(w::DecodeWelcome(w::EncodeWelcome(m), &n).ok());
      FUZZ_CHECK(m.incarnation == n.incarnation && SameLayout(m.layout, n.layout) &&
                 m.proof == n.proof);
      UseLayout(m.layout);
      break;
    }
    case 3: {
      w::Begin m, n;
      if (!w::DecodeBegin(meta, &m).ok()) return 0;
      FUZZ_CHECK(w::EncodeBegin(m) == meta);
      FUZZ_CHECK(w::DecodeBegin(meta, &n).ok() && n.dst_blocks == m.dst_blocks);
      break;
    }
    case 4: {
      w::DataMeta m;
      if (!w::DecodeDataMeta(meta, &m).ok()) return 0;
      FUZZ_CHECK(w::EncodeDataMeta(m) == meta);
      break;
    }
    case 5: {
      w::Finish m;
      if (!w::DecodeFinish(meta, &m).ok()) return 0;
      FUZZ_CHECK(w::EncodeFinish(m) == meta);
      break;
    }
    case 6: {
      w::Outcome m, n;
      if (!w::DecodeOutcome(meta, &m).ok()) return 0;
      // Codes beyond absl's are read as UNKNOWN; the rest survives a round trip.
      FUZZ_CHECK(w::DecodeOutcome(w::EncodeOutcome(m), &n).ok());
      FUZZ_CHECK(n.transfer_id == m.transfer_id && n.attempt == m.attempt && n.status == m.status);
      break;
    }
    case 8: {
      w::Challenge m;
      if (!w::DecodeChallenge(meta, &m).ok()) return 0;
      FUZZ_CHECK(w::EncodeChallenge(m) == meta);
      break;
    }
    case 9: {
      w::Auth m;
      if (!w::DecodeAuth(meta, &m).ok()) return 0;
      FUZZ_CHECK(w::EncodeAuth(m) == meta);
      break;
    }
    default: {
      // A whole frame as MakeFrame writes it, read back as the receiver does.
      const std::string frame = w::MakeFrame(w::FrameType::kFinish, 0, meta);
      auto p = w::DecodePrefix(reinterpret_cast<const uint8_t*>(frame.data()));
      if (meta.size() > w::kMaxMetaBytes) return 0;
      FUZZ_CHECK(p.ok() && p->meta_len == meta.size());
      FUZZ_CHECK(w::VerifyMeta(*p, frame.substr(w::kPrefixBytes)).ok());
      break;
    }
  }
  return 0;
}
