#include "kvtransfer/receiver_core.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/cluster/transfer_key.h"
#include "kvtransfer/auth.h"
#include "kvtransfer/transfer_window.h"

namespace tandem::kvtransfer {

uint64_t NewIncarnation() {
  absl::StatusOr<uint64_t> id = NewTransferId();  // the same generator: 64 random bits, not 0
  if (id.ok()) return *id;
  std::random_device rd;  // only if OpenSSL's generator failed
  return ((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
          static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()))) |
         1;
}

namespace {
constexpr uint8_t kMissing = 0;
constexpr uint8_t kWriting = 1;
constexpr uint8_t kDone = 2;
constexpr uint8_t kOutsideWindow = 3;  // a windowed layer's block before window_first: not sent
}  // namespace

struct ReceiverCore::Entry {
  Expectation exp;
  std::unordered_map<int32_t, int32_t> index;  // dst block -> position in exp.dst_blocks
  std::string invalid;                         // why the expectation itself is unusable
  int64_t last_attempt = -1;
  bool active = false;
  uint64_t owner = 0;  // the link the last attempt began on
  // Links whose BEGIN proved the transfer's key (its attempts' senders): their late messages
  // are answered in detail, anyone else's are refused as kNotNamed.
  std::vector<uint64_t> named;
  absl::Time deadline = absl::InfiniteFuture();
  absl::Time expected_at;  // Expect: what CompletedTransfer::waited counts from
  absl::Time started;
  ResultFn result;
  absl::Status failure;  // how the last attempt ended, when it failed
  // [layer][position]: kMissing / kWriting / kDone, kOutsideWindow for cells never sent
  std::vector<uint8_t> cells;
  int64_t cells_expected = 0;
  int64_t cells_done = 0;
  uint64_t frames = 0;
  uint64_t bytes = 0;
  // Writers hold io_mu around each syscall into the regions and check generation under it;
  // generation (changed under mu_) invalidates outstanding tickets.
  std::mutex io_mu;
  std::atomic<uint64_t> generation{0};
};

ReceiverCore::ReceiverCore(const KvLayout& layout, KvRegionAccess* access,
                           KvReceiver::CompletionCallback on_complete,
                           absl::Duration deadline_grace, absl::Duration max_transfer_time,
                           const std::string& thread_name, TransferHooks* hooks)
    : layout_(layout),
      access_(access),
      on_complete_(std::move(on_complete)),
      deadline_grace_(deadline_grace),
      max_transfer_time_(max_transfer_time),
      hooks_(hooks),
      loop_(thread_name, absl::Milliseconds(20), [this] { Tick(); }) {}

ReceiverCore::~ReceiverCore() {
  loop_.Stop();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, e] : entries_) {
    InvalidateLocked(e.get());
    std::lock_guard<std::mutex> io(e->io_mu);  // a write in progress ends
  }
  entries_.clear();
  std::lock_guard<std::mutex> release(release_mu_);
  pending_releases_.clear();  // no callback after destruction began
  held_completions_.clear();
}

uint64_t ReceiverCore::NewOwnerId() {
  std::lock_guard<std::mutex> lock(mu_);
  return next_owner_++;
}

void ReceiverCore::InvalidateLocked(Entry* e) { e->generation.fetch_add(1); }

void ReceiverCore::Expect(const Expectation& expectation) {
  auto e = std::make_shared<Entry>();
  e->exp = expectation;
  e->expected_at = absl::Now();
  const int64_t num_blocks = access_->num_blocks();
  for (size_t i = 0; i < expectation.dst_blocks.size(); ++i) {
    const int32_t b = expectation.dst_blocks[i];
    if (b < 0 || b >= num_blocks) {
      e->invalid = absl::StrCat("expected block ", b, " is outside the pool [0, ", num_blocks, ")");
      break;
    }
    if (!e->index.emplace(b, static_cast<int32_t>(i)).second) {
      e->invalid = absl::StrCat("expectation lists block ", b, " twice");
      break;
    }
  }
  if (e->invalid.empty()) {
    absl::Status window =
        ValidateTransferWindow(expectation.window_layers, expectation.window_first,
                               layout_.num_layers, expectation.dst_blocks.size());
    if (!window.ok()) e->invalid = std::string(window.message());
  }
  if (!e->invalid.empty()) {
    TLOG(ERROR) << "kv transfer " << expectation.transfer_id << ": " << e->invalid;
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(expectation.transfer_id);
  if (it != entries_.end()) {  // replaced: the old registration ends like a Cancel
    Entry* old = it->second.get();
    InvalidateLocked(old);
    // The new entry has its own io_mu: a write of the old one in progress ends first.
    { std::lock_guard<std::mutex> io(old->io_mu); }
    if (old->active && old->result) {
      loop_.Post([this, r = old->result] {
        if (!shutting_down_) r(absl::AbortedError("expectation replaced by the receiver"));
      });
    }
    it->second = e;
  } else {
    entries_.emplace(expectation.transfer_id, e);
  }
}

void ReceiverCore::Cancel(uint64_t transfer_id, std::function<bool()> writes_over,
                          KvReceiver::ReleasedCallback released) {
  PendingRelease p;
  p.writes_over = std::move(writes_over);
  p.released = std::move(released);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(transfer_id);
    if (it != entries_.end()) {
      p.entry = std::move(it->second);
      entries_.erase(it);
      InvalidateLocked(p.entry.get());
      if (p.entry->active && p.entry->result) {
        loop_.Post([this, r = p.entry->result] {
          if (!shutting_down_) r(absl::AbortedError("transfer cancelled by the receiver"));
        });
      }
    }
  }
  {
    // A completion held for older writes: no on_complete follows a Cancel.
    std::lock_guard<std::mutex> lock(release_mu_);
    held_completions_.erase(std::remove_if(held_completions_.begin(), held_completions_.end(),
                                           [&](const HeldCompletion& h) {
                                             return h.completed.transfer_id == transfer_id;
                                           }),
                            held_completions_.end());
  }
  if (Released(&p)) {
    if (p.released) p.released();
    return;
  }
  std::lock_guard<std::mutex> lock(release_mu_);
  pending_releases_.push_back(std::move(p));
}

bool ReceiverCore::Released(PendingRelease* p) {
  if (!p->fenced) {
    // Free now: a write that checked the old generation is over, later ones see the new one.
    if (p->entry == nullptr || p->entry->io_mu.try_lock()) {
      if (p->entry != nullptr) p->entry->io_mu.unlock();
      p->fenced = true;
    }
  }
  return p->fenced && (!p->writes_over || p->writes_over());
}

void ReceiverCore::WakeReleases() {
  loop_.Post([this] { CheckReleases(); });
}

void ReceiverCore::Shutdown() {
  shutting_down_ = true;
  std::lock_guard<std::mutex> check(check_mu_);
  std::lock_guard<std::mutex> lock(release_mu_);
  pending_releases_.clear();
  held_completions_.clear();
}

void ReceiverCore::CheckReleases() {
  std::lock_guard<std::mutex> check(check_mu_);
  if (shutting_down_) return;
  std::vector<PendingRelease> pending;
  std::vector<HeldCompletion> held;  // copies: they stay listed while checked, for Cancel
  {
    std::lock_guard<std::mutex> lock(release_mu_);
    if (pending_releases_.empty() && held_completions_.empty()) return;
    pending.swap(pending_releases_);
    held = held_completions_;
  }
  std::vector<PendingRelease> waiting;
  for (PendingRelease& p : pending) {
    if (!Released(&p)) {
      waiting.push_back(std::move(p));
    } else if (p.released && !shutting_down_) {
      p.released();
    }
  }
  std::vector<uint64_t> over;
  for (HeldCompletion& h : held) {
    if (h.writes_over()) over.push_back(h.serial);
  }
  std::vector<CompletedTransfer> deliver;
  {
    std::lock_guard<std::mutex> lock(release_mu_);
    for (PendingRelease& p : waiting) pending_releases_.push_back(std::move(p));
    // Those a Cancel dropped meanwhile are gone from the list: not delivered.
    for (auto it = held_completions_.begin(); it != held_completions_.end();) {
      if (std::find(over.begin(), over.end(), it->serial) != over.end()) {
        deliver.push_back(std::move(it->completed));
        it = held_completions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const CompletedTransfer& c : deliver) {
    if (on_complete_ && !shutting_down_) on_complete_(c);
  }
}

int64_t ReceiverCore::num_in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(entries_.size());
}

absl::Status ReceiverCore::NotExpected(uint64_t transfer_id, uint32_t attempt) {
  return absl::NotFoundError(absl::StrCat("kv transfer ", transfer_id, " attempt ", attempt,
                                          " is not expected from this sender (unknown, ended, "
                                          "or not named for it)"));
}

void ReceiverCore::RefuseNotNamedLocked(uint64_t transfer_id, const char* what) {
  counters_.messages_refused.fetch_add(1, std::memory_order_relaxed);
  if (hooks_ != nullptr) hooks_->Refused(TransferDirection::kReceive, KvRefusal::kNotNamed);
  const absl::Time now = absl::Now();
  if (now - last_refusal_log_ < absl::Seconds(10)) {
    ++refusals_not_logged_;
    return;
  }
  TLOG(WARNING) << "kv transfer " << transfer_id << ": refused " << what
                << " from a sender not named for the transfer"
                << (refusals_not_logged_ > 0
                        ? absl::StrCat(" (and ", refusals_not_logged_, " more since the last)")
                        : std::string());
  last_refusal_log_ = now;
  refusals_not_logged_ = 0;
}

ReceiverCore::Entry* ReceiverCore::OwnedLocked(uint64_t owner, uint64_t transfer_id,
                                               uint32_t attempt, absl::Status* status) {
  auto it = entries_.find(transfer_id);
  if (it == entries_.end()) {
    *status = NotExpected(transfer_id, attempt);
    return nullptr;
  }
  Entry* e = it->second.get();
  if (owner != e->owner && std::find(e->named.begin(), e->named.end(), owner) == e->named.end()) {
    if (!e->exp.transfer_key.empty() || e->owner != 0) {
      RefuseNotNamedLocked(transfer_id, "a message of another sender's attempt");
    }
    *status = NotExpected(transfer_id, attempt);
    return nullptr;
  }
  return e;
}

absl::Status ReceiverCore::Begin(AttemptStart start, ResultFn result) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(start.transfer_id);
  if (it == entries_.end()) return NotExpected(start.transfer_id, start.attempt);
  Entry* e = it->second.get();
  // Proven with this attempt's key (TransferAttemptKey): the key of another attempt, which the
  // sender named for that one holds, proves nothing here.
  if (!e->exp.transfer_key.empty() &&
      !ProofMatches(start.proof, BeginProof(TransferAttemptKey(e->exp.transfer_key, start.attempt),
                                            start.binding, start.transfer_id, start.attempt,
                                            start.dst_blocks))) {
    RefuseNotNamedLocked(start.transfer_id, "a BEGIN without the proof of its key");
    return NotExpected(start.transfer_id, start.attempt);
  }
  // From here on the sender holds the key: it is told what is wrong.
  if (std::find(e->named.begin(), e->named.end(), start.owner) == e->named.end()) {
    e->named.push_back(start.owner);
  }
  if (!e->invalid.empty()) return absl::InvalidArgumentError(e->invalid);
  if (static_cast<int64_t>(start.attempt) <= e->last_attempt) {
    return absl::AbortedError(absl::StrCat("attempt ", start.attempt, " of transfer ",
                                           start.transfer_id, " is stale: attempt ",
                                           e->last_attempt, " already started"));
  }
  const std::vector<int32_t>& want = e->exp.dst_blocks;
  if (start.dst_blocks != want) {
    if (start.dst_blocks.size() != want.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("transfer ", start.transfer_id, " sends ", start.dst_blocks.size(),
                       " blocks, the receiver expects ", want.size()));
    }
    for (size_t i = 0; i < want.size(); ++i) {
      if (start.dst_blocks[i] != want[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("transfer ", start.transfer_id, " targets block ", start.dst_blocks[i],
                         " at position ", i, " where the receiver expects block ", want[i]));
      }
    }
  }
  if (e->active) {
    FailAttemptLocked(e, absl::AbortedError(absl::StrCat("superseded by attempt ", start.attempt)),
                      /*notify_sender=*/true);
  }
  InvalidateLocked(e);
  e->last_attempt = start.attempt;
  e->active = true;
  e->owner = start.owner;
  e->deadline = std::min(start.deadline, absl::Now() + max_transfer_time_);
  e->started = absl::Now();
  e->result = std::move(result);
  e->failure = absl::OkStatus();
  e->cells.assign(static_cast<size_t>(layout_.num_layers) * want.size(), kMissing);
  for (int64_t l : e->exp.window_layers) {
    std::fill_n(e->cells.begin() + l * want.size(), e->exp.window_first, kOutsideWindow);
  }
  e->cells_expected =
      TransferRegions(e->exp.window_layers, e->exp.window_first, layout_.num_layers, want.size());
  e->cells_done = 0;
  e->frames = 0;
  e->bytes = 0;
  counters_.transfers_started.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::StatusOr<ReceiverCore::Ticket> ReceiverCore::AdmitData(uint64_t owner, uint64_t transfer_id,
                                                             uint32_t attempt, int64_t layer,
                                                             absl::Span<const int32_t> blocks,
                                                             bool* reported) {
  *reported = false;
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status refused;
  Entry* e = OwnedLocked(owner, transfer_id, attempt, &refused);
  if (e == nullptr) return refused;
  if (static_cast<int64_t>(attempt) != e->last_attempt || owner != e->owner) {
    return absl::AbortedError(absl::StrCat("data for attempt ", attempt, " of transfer ",
                                           transfer_id, " but the live attempt is ",
                                           e->last_attempt));
  }
  *reported = true;  // from here on the outcome of this attempt reaches the sender
  if (!e->active) {
    return e->failure.ok() ? absl::AbortedError("attempt already ended") : e->failure;
  }
  const size_t nb = e->exp.dst_blocks.size();
  if (layer < 0 || layer >= layout_.num_layers) {
    absl::Status s = absl::InvalidArgumentError(
        absl::StrCat("data for layer ", layer, " outside [0, ", layout_.num_layers, ")"));
    FailAttemptLocked(e, s, /*notify_sender=*/true);
    return s;
  }
  Ticket t;
  t.layer = layer;
  t.cells.reserve(blocks.size());
  t.regions.reserve(blocks.size());
  for (int32_t b : blocks) {
    auto pos = e->index.find(b);
    absl::Status s;
    if (pos == e->index.end()) {
      s = absl::InvalidArgumentError(
          absl::StrCat("data for block ", b, " which transfer ", transfer_id, " does not include"));
    } else {
      const int32_t cell = static_cast<int32_t>(layer * nb + pos->second);
      if (e->cells[cell] == kOutsideWindow) {
        s = absl::InvalidArgumentError(absl::StrCat(
            "data for layer ", layer, " block ", b, " which transfer ", transfer_id,
            " does not include: the layer is windowed and sends only blocks from position ",
            e->exp.window_first, " of ", nb));
      } else if (e->cells[cell] != kMissing) {
        s = absl::InvalidArgumentError(absl::StrCat("layer ", layer, " block ", b, " of transfer ",
                                                    transfer_id, " arrived twice"));
      } else {
        e->cells[cell] = kWriting;  // also catches a block listed twice in one message
        t.cells.push_back(cell);
        t.regions.push_back(access_->Region(layer, b));
        continue;
      }
    }
    for (int32_t c : t.cells) e->cells[c] = kMissing;
    FailAttemptLocked(e, s, /*notify_sender=*/true);
    return s;
  }
  t.entry = entries_[transfer_id];
  t.generation = e->generation;
  t.deadline = e->deadline;
  return t;
}

absl::StatusOr<ReceiverCore::Ticket> ReceiverCore::AdmitAll(uint64_t owner, uint64_t transfer_id,
                                                            uint32_t attempt) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status refused;
  Entry* e = OwnedLocked(owner, transfer_id, attempt, &refused);
  if (e == nullptr) return refused;
  if (static_cast<int64_t>(attempt) != e->last_attempt || owner != e->owner) {
    return absl::AbortedError(absl::StrCat("admission for attempt ", attempt, " of transfer ",
                                           transfer_id, " but the live attempt is ",
                                           e->last_attempt));
  }
  if (!e->active) {
    return e->failure.ok() ? absl::AbortedError("attempt already ended") : e->failure;
  }
  const size_t nb = e->exp.dst_blocks.size();
  Ticket t;
  t.layer = -1;  // every layer
  t.cells.reserve(e->cells.size());
  t.regions.reserve(e->cells.size());
  for (size_t c = 0; c < e->cells.size(); ++c) {
    if (e->cells[c] == kOutsideWindow) continue;
    if (e->cells[c] != kMissing) {
      for (int32_t done : t.cells) e->cells[done] = kMissing;
      return absl::FailedPreconditionError(
          absl::StrCat("transfer ", transfer_id, " attempt ", attempt, ": layer ", c / nb,
                       " block ", e->exp.dst_blocks[c % nb], " was admitted already"));
    }
    e->cells[c] = kWriting;
    t.cells.push_back(static_cast<int32_t>(c));
    t.regions.push_back(access_->Region(static_cast<int64_t>(c / nb), e->exp.dst_blocks[c % nb]));
  }
  t.entry = entries_[transfer_id];
  t.generation = e->generation;
  t.deadline = e->deadline;
  return t;
}

std::mutex* ReceiverCore::io_mutex(const Ticket& ticket) { return &ticket.entry->io_mu; }

bool ReceiverCore::Writable(const Ticket& ticket) const {
  return ticket.entry->generation == ticket.generation;
}

void ReceiverCore::EndData(const Ticket& ticket, const absl::Status& status, uint64_t frames) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry* e = ticket.entry.get();
  if (e->generation != ticket.generation) return;  // the attempt ended meanwhile
  if (!status.ok()) {
    for (int32_t c : ticket.cells) e->cells[c] = kMissing;
    FailAttemptLocked(e, status, /*notify_sender=*/true);
    return;
  }
  for (int32_t c : ticket.cells) e->cells[c] = kDone;
  e->cells_done += static_cast<int64_t>(ticket.cells.size());
  e->frames += frames;
  e->bytes += ticket.cells.size() * layout_.region_bytes();
  counters_.frames.fetch_add(frames, std::memory_order_relaxed);
  counters_.bytes.fetch_add(ticket.cells.size() * layout_.region_bytes(),
                            std::memory_order_relaxed);
}

absl::Status ReceiverCore::Finish(uint64_t owner, uint64_t transfer_id, uint32_t attempt,
                                  uint64_t frames, uint64_t bytes, std::string trailer,
                                  std::function<bool()> writes_over) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status refused;
  Entry* e = OwnedLocked(owner, transfer_id, attempt, &refused);
  if (e == nullptr) return refused;
  auto it = entries_.find(transfer_id);
  if (static_cast<int64_t>(attempt) != e->last_attempt || owner != e->owner) {
    return absl::AbortedError(absl::StrCat("finish for attempt ", attempt, " of transfer ",
                                           transfer_id, " but the live attempt is ",
                                           e->last_attempt));
  }
  if (!e->active) return absl::OkStatus();  // failed earlier; the sender was told then
  const int64_t total = e->cells_expected;
  if (e->cells_done != total || e->frames != frames || e->bytes != bytes) {
    std::string missing;
    const size_t nb = e->exp.dst_blocks.size();
    for (size_t c = 0; c < e->cells.size(); ++c) {
      if (e->cells[c] != kDone && e->cells[c] != kOutsideWindow) {
        missing =
            absl::StrCat("; first missing: layer ", c / nb, " block ", e->exp.dst_blocks[c % nb]);
        break;
      }
    }
    FailAttemptLocked(
        e,
        absl::DataLossError(absl::StrCat("transfer ", transfer_id, " attempt ", attempt,
                                         " incomplete: ", e->cells_done, " of ", total,
                                         " regions and ", e->frames, " of ", frames, " messages (",
                                         e->bytes, " of ", bytes, " bytes) arrived", missing)),
        /*notify_sender=*/true);
    return absl::OkStatus();
  }
  std::shared_ptr<Entry> done = std::move(it->second);
  entries_.erase(it);
  InvalidateLocked(done.get());
  done->active = false;
  counters_.transfers_ok.fetch_add(1, std::memory_order_relaxed);
  const absl::Time now = absl::Now();
  counters_.RecordLatency(now - done->started);
  loop_.Post([this, r = done->result, id = transfer_id, attempt, trailer = std::move(trailer),
              waited = now - done->expected_at, writes_over = std::move(writes_over)] {
    if (shutting_down_) return;
    if (r) r(absl::OkStatus());
    CompletedTransfer c;
    c.transfer_id = id;
    c.attempt = attempt;
    c.trailer = trailer;
    c.waited = waited;
    if (writes_over) {
      // An older attempt's writes may still land in the blocks: held until they are over.
      // Checked under check_mu_, as CheckReleases does: never once Shutdown returned.
      std::lock_guard<std::mutex> check(check_mu_);
      if (shutting_down_) return;
      if (!writes_over()) {
        std::lock_guard<std::mutex> lock(release_mu_);
        held_completions_.push_back({next_held_++, std::move(c), writes_over});
        return;
      }
    }
    if (on_complete_) on_complete_(c);
  });
  return absl::OkStatus();
}

void ReceiverCore::Abort(uint64_t owner, uint64_t transfer_id, uint32_t attempt,
                         const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status refused;
  Entry* e = OwnedLocked(owner, transfer_id, attempt, &refused);
  if (e == nullptr) return;
  if (static_cast<int64_t>(attempt) != e->last_attempt || owner != e->owner || !e->active) return;
  FailAttemptLocked(e, why, /*notify_sender=*/false);
}

void ReceiverCore::FailOwner(uint64_t owner, const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, e] : entries_) {
    if (e->active && e->owner == owner) FailAttemptLocked(e.get(), why, /*notify_sender=*/false);
  }
}

void ReceiverCore::FailAttemptLocked(Entry* e, const absl::Status& status, bool notify_sender) {
  if (!e->active) return;
  InvalidateLocked(e);
  e->active = false;
  e->failure = status;
  counters_.transfers_failed.fetch_add(1, std::memory_order_relaxed);
  if (absl::IsDeadlineExceeded(status)) {
    counters_.deadline_expired.fetch_add(1, std::memory_order_relaxed);
  }
  ResultFn r = notify_sender ? e->result : nullptr;
  e->result = nullptr;
  CompletedTransfer c;
  c.transfer_id = e->exp.transfer_id;
  c.attempt = static_cast<uint32_t>(e->last_attempt);
  c.status = status;
  c.waited = absl::Now() - e->expected_at;
  loop_.Post([this, r = std::move(r), c = std::move(c)] {
    if (shutting_down_) return;
    if (r) r(c.status);
    if (on_complete_) on_complete_(c);
  });
}

void ReceiverCore::Tick() {
  CheckReleases();
  const absl::Time now = absl::Now();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, e] : entries_) {
    if (e->active && e->deadline != absl::InfiniteFuture() && now > e->deadline + deadline_grace_) {
      FailAttemptLocked(
          e.get(),
          absl::DeadlineExceededError(absl::StrCat("transfer ", id, " attempt ", e->last_attempt,
                                                   " passed its deadline without finishing")),
          /*notify_sender=*/true);
    }
  }
}

}  // namespace tandem::kvtransfer
