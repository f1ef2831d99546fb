#include "kvtransfer/tcp/wire.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "kvtransfer/crc32c.h"

namespace tandem::kvtransfer::wire {
namespace {

class Writer {
 public:
  void U8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void U16(uint16_t v) { Raw(&v, 2); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void I64(int64_t v) { Raw(&v, 8); }
  void Str(absl::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    out_.append(s.data(), s.size());
  }
  void Blocks(const std::vector<int32_t>& b) {
    U32(static_cast<uint32_t>(b.size()));
    Raw(b.data(), b.size() * sizeof(int32_t));
  }
  void Layout(const KvLayout& l) {
    U32(l.protocol_version);
    Str(l.model_id);
    I64(l.num_layers);
    I64(l.num_kv_heads);
    I64(l.head_dim);
    I64(l.block_size);
    U8(static_cast<uint8_t>(l.kv_dtype));
  }
  void Status(const absl::Status& s) {
    U32(static_cast<uint32_t>(s.code()));
    Str(s.message());
  }
  std::string Take() { return std::move(out_); }

 private:
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }  // LE host
  std::string out_;
};

class Reader {
 public:
  explicit Reader(absl::string_view in) : in_(in) {}
  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool U32(uint32_t* v) { return Raw(v, 4); }
  bool U64(uint64_t* v) { return Raw(v, 8); }
  bool I64(int64_t* v) { return Raw(v, 8); }
  bool Str(std::string* s) {
    uint32_t n;
    if (!U32(&n) || n > in_.size() - pos_) return false;
    s->assign(in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Blocks(std::vector<int32_t>* b) {
    uint32_t n;
    if (!U32(&n) || static_cast<uint64_t>(n) * 4 > in_.size() - pos_) return false;
    b->resize(n);
    return Raw(b->data(), static_cast<size_t>(n) * 4);
  }
  bool Layout(KvLayout* l) {
    uint8_t dtype;
    if (!U32(&l->protocol_version) || !Str(&l->model_id) || !I64(&l->num_layers) ||
        !I64(&l->num_kv_heads) || !I64(&l->head_dim) || !I64(&l->block_size) || !U8(&dtype)) {
      return false;
    }
    l->kv_dtype = static_cast<DType>(dtype);
    return true;
  }
  bool Status(absl::Status* s) {
    uint32_t code;
    std::string message;
    if (!U32(&code) || !Str(&message)) return false;
    if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
      code = static_cast<uint32_t>(absl::StatusCode::kUnknown);
    }
    *s = code == 0 ? absl::OkStatus() : absl::Status(static_cast<absl::StatusCode>(code), message);
    return true;
  }
  bool AtEnd() const { return pos_ == in_.size(); }

 private:
  bool Raw(void* p, size_t n) {
    if (n > in_.size() - pos_) return false;
    if (n == 0) return true;  // p may be null (an empty block list): memcpy(nullptr, ..., 0) is UB
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  absl::string_view in_;
  size_t pos_ = 0;
};

absl::Status Malformed(const char* what) {
  return absl::DataLossError(absl::StrCat("malformed kv transfer ", what, " message"));
}

}  // namespace

const char* FrameTypeName(FrameType type) {
  switch (type) {
    case FrameType::kHello:
      return "HELLO";
    case FrameType::kWelcome:
      return "WELCOME";
    case FrameType::kRefuse:
      return "REFUSE";
    case FrameType::kBegin:
      return "BEGIN";
    case FrameType::kData:
      return "DATA";
    case FrameType::kFinish:
      return "FINISH";
    case FrameType::kAbort:
      return "ABORT";
    case FrameType::kResult:
      return "RESULT";
    case FrameType::kChallenge:
      return "CHALLENGE";
    case FrameType::kAuth:
      return "AUTH";
  }
  return "?";
}

void EncodePrefix(const Prefix& p, uint8_t out[kPrefixBytes]) {
  const uint32_t magic = kFrameMagic;
  const uint16_t type = static_cast<uint16_t>(p.type);
  std::memcpy(out, &magic, 4);
  std::memcpy(out + 4, &type, 2);
  std::memcpy(out + 6, &p.flags, 2);
  std::memcpy(out + 8, &p.meta_len, 4);
  std::memcpy(out + 12, &p.meta_crc, 4);
}

absl::StatusOr<Prefix> DecodePrefix(const uint8_t in[kPrefixBytes]) {
  uint32_t magic;
  uint16_t type;
  Prefix p;
  std::memcpy(&magic, in, 4);
  std::memcpy(&type, in + 4, 2);
  std::memcpy(&p.flags, in + 6, 2);
  std::memcpy(&p.meta_len, in + 8, 4);
  std::memcpy(&p.meta_crc, in + 12, 4);
  if (magic != kFrameMagic) {
    return absl::DataLossError("kv transfer stream out of sync (bad message magic)");
  }
  if (type < static_cast<uint16_t>(FrameType::kHello) ||
      type > static_cast<uint16_t>(FrameType::kAuth)) {
    return absl::DataLossError(absl::StrCat("unknown kv transfer message type ", type));
  }
  if (p.meta_len > kMaxMetaBytes) {
    return absl::DataLossError(absl::StrCat("kv transfer metadata of ", p.meta_len, " bytes"));
  }
  p.type = static_cast<FrameType>(type);
  return p;
}

absl::Status VerifyMeta(const Prefix& prefix, absl::string_view meta) {
  if (Crc32c(0, meta.data(), meta.size()) != prefix.meta_crc) {
    return absl::DataLossError(
        absl::StrCat("checksum mismatch in kv transfer ", FrameTypeName(prefix.type), " metadata"));
  }
  return absl::OkStatus();
}

std::string EncodeHello(const Hello& m) {
  Writer w;
  w.U32(m.magic);
  w.Layout(m.layout);
  return w.Take();
}

std::string EncodeWelcome(const Welcome& m) {
  Writer w;
  w.U64(m.incarnation);
  w.Layout(m.layout);
  w.Str(m.proof);
  return w.Take();
}

std::string EncodeChallenge(const Challenge& m) {
  Writer w;
  w.Str(m.nonce);
  return w.Take();
}

std::string EncodeAuth(const Auth& m) {
  Writer w;
  w.Str(m.nonce);
  w.Str(m.proof);
  return w.Take();
}

std::string EncodeBegin(const Begin& m) {
  Writer w;
  w.U64(m.transfer_id);
  w.U32(m.attempt);
  w.U64(m.incarnation);
  w.I64(m.deadline_ms);
  w.Blocks(m.dst_blocks);
  w.Str(m.proof);
  return w.Take();
}

std::string EncodeDataMeta(const DataMeta& m) {
  Writer w;
  w.U64(m.transfer_id);
  w.U32(m.attempt);
  w.U32(m.layer);
  w.U64(m.payload_len);
  w.Blocks(m.blocks);
  return w.Take();
}

std::string EncodeFinish(const Finish& m) {
  Writer w;
  w.U64(m.transfer_id);
  w.U32(m.attempt);
  w.U64(m.frames);
  w.U64(m.bytes);
  w.Str(m.trailer);
  return w.Take();
}

std::string EncodeOutcome(const Outcome& m) {
  Writer w;
  w.U64(m.transfer_id);
  w.U32(m.attempt);
  w.Status(m.status);
  return w.Take();
}

absl::Status DecodeHello(absl::string_view meta, Hello* m) {
  Reader r(meta);
  if (!r.U32(&m->magic) || !r.Layout(&m->layout) || !r.AtEnd()) return Malformed("HELLO");
  return absl::OkStatus();
}

absl::Status DecodeWelcome(absl::string_view meta, Welcome* m) {
  Reader r(meta);
  if (!r.U64(&m->incarnation) || !r.Layout(&m->layout) || !r.Str(&m->proof) || !r.AtEnd()) {
    return Malformed("WELCOME");
  }
  return absl::OkStatus();
}

absl::Status DecodeChallenge(absl::string_view meta, Challenge* m) {
  Reader r(meta);
  if (!r.Str(&m->nonce) || !r.AtEnd()) return Malformed("CHALLENGE");
  return absl::OkStatus();
}

absl::Status DecodeAuth(absl::string_view meta, Auth* m) {
  Reader r(meta);
  if (!r.Str(&m->nonce) || !r.Str(&m->proof) || !r.AtEnd()) return Malformed("AUTH");
  return absl::OkStatus();
}

absl::Status DecodeBegin(absl::string_view meta, Begin* m) {
  Reader r(meta);
  if (!r.U64(&m->transfer_id) || !r.U32(&m->attempt) || !r.U64(&m->incarnation) ||
      !r.I64(&m->deadline_ms) || !r.Blocks(&m->dst_blocks) || !r.Str(&m->proof) || !r.AtEnd()) {
    return Malformed("BEGIN");
  }
  return absl::OkStatus();
}

absl::Status DecodeDataMeta(absl::string_view meta, DataMeta* m) {
  Reader r(meta);
  if (!r.U64(&m->transfer_id) || !r.U32(&m->attempt) || !r.U32(&m->layer) ||
      !r.U64(&m->payload_len) || !r.Blocks(&m->blocks) || !r.AtEnd()) {
    return Malformed("DATA");
  }
  return absl::OkStatus();
}

absl::Status DecodeFinish(absl::string_view meta, Finish* m) {
  Reader r(meta);
  if (!r.U64(&m->transfer_id) || !r.U32(&m->attempt) || !r.U64(&m->frames) || !r.U64(&m->bytes) ||
      !r.Str(&m->trailer) || !r.AtEnd()) {
    return Malformed("FINISH");
  }
  return absl::OkStatus();
}

absl::Status DecodeOutcome(absl::string_view meta, Outcome* m) {
  Reader r(meta);
  if (!r.U64(&m->transfer_id) || !r.U32(&m->attempt) || !r.Status(&m->status) || !r.AtEnd()) {
    return Malformed("ABORT/RESULT/REFUSE");
  }
  return absl::OkStatus();
}

std::string MakeFrame(FrameType type, uint16_t flags, const std::string& meta) {
  Prefix p;
  p.type = type;
  p.flags = flags;
  p.meta_len = static_cast<uint32_t>(meta.size());
  p.meta_crc = Crc32c(0, meta.data(), meta.size());
  std::string out(kPrefixBytes, '\0');
  EncodePrefix(p, reinterpret_cast<uint8_t*>(out.data()));
  out += meta;
  return out;
}

}  // namespace tandem::kvtransfer::wire
