#include "common/engine/kv/tiers/disk_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/log.h"
#include "common/engine/kv/tiers/kv_tier_hooks.h"

namespace tandem {
namespace {

constexpr char kSuffix[] = ".blk";
constexpr char kTempSuffix[] = ".tmp";

std::string Errno(int err) { return std::strerror(err); }

// Errors after which writing more is pointless: the disk is full, read-only or refuses us.
bool DisablesTier(int err) {
  return err == ENOSPC || err == EDQUOT || err == EFBIG || err == EROFS || err == EACCES ||
         err == EPERM || err == EIO;
}

// Creates `dir` (0700) if missing; refuses a directory another user owns or others can write.
absl::Status PrivateDir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create KV offload directory ", dir, ": ", Errno(errno)));
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("KV offload directory ", dir, " is not a directory"));
  }
  if (st.st_uid != ::geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV offload directory ", dir,
        " must belong to this user and not be writable by others (another local user could plant "
        "KV blocks); chmod 700 it or pick another"));
  }
  return absl::OkStatus();
}

bool WriteAll(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(const DiskTierOptions& options) {
  if (options.dir.empty()) return absl::InvalidArgumentError("disk tier needs a directory");
  if (options.capacity_bytes <= 0) {
    return absl::InvalidArgumentError("--kv-offload-disk-size must be > 0");
  }
  if (absl::Status st = PrivateDir(options.dir); !st.ok()) return st;
  // A file-size limit (ulimit -f) makes a write fail with EFBIG (and turns the tier off) instead
  // of killing the process.
  std::signal(SIGXFSZ, SIG_IGN);
  const std::string path = absl::StrFormat("%s/tandem-kv-%016x", options.dir, options.fingerprint);
  if (absl::Status st = PrivateDir(path); !st.ok()) return st;
  const std::string lock = path + "/lock";
  const int fd = ::open(lock.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot open ", lock, ": ", Errno(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("KV offload directory ", path, " is in use by another worker (", Errno(err),
                     "); give each worker its own --kv-offload-dir"));
  }
  std::unique_ptr<DiskTier> tier(new DiskTier(options, path, fd));
  tier->Scan();
  return tier;
}

DiskTier::DiskTier(const DiskTierOptions& options, std::string path, int lock_fd)
    : options_(options), path_(std::move(path)), lock_fd_(lock_fd) {}

DiskTier::~DiskTier() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the lock
}

std::string DiskTier::FileOf(BlockHash hash) const {
  return absl::StrFormat("%s/%016x%s", path_, hash, kSuffix);
}

void DiskTier::Scan() {
  struct Found {
    BlockHash hash;
    int64_t bytes;
    int64_t mtime_ns;
  };
  std::vector<Found> found;
  DIR* d = ::opendir(path_.c_str());
  if (d == nullptr) return;
  int64_t temps = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    const std::string full = absl::StrCat(path_, "/", name);
    if (absl::StrContains(name, kTempSuffix)) {  // a write that never finished
      ::unlink(full.c_str());
      ++temps;
      continue;
    }
    if (!absl::EndsWith(name, kSuffix) || name.size() != 16 + sizeof(kSuffix) - 1) continue;
    uint64_t hash = 0;
    if (!absl::SimpleHexAtoi(name.substr(0, 16), &hash)) continue;
    struct stat st;
    if (::stat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    found.push_back({hash, static_cast<int64_t>(st.st_size),
                     static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
  }
  ::closedir(d);
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.mtime_ns < b.mtime_ns; });
  std::lock_guard<std::mutex> lock(mu_);
  for (const Found& f : found) {
    index_[f.hash] = lru_.insert(lru_.end(), Entry{f.hash, f.bytes});
    c_.used_bytes += f.bytes;
    if (options_.listener != nullptr) options_.listener->OnTierStored(KvTier::kDisk, f.hash);
  }
  MakeRoomLocked(0);
  TLOG(INFO) << "KV disk tier " << path_ << ": " << index_.size() << " blocks ("
             << (c_.used_bytes >> 20) << " MiB) found"
             << (temps > 0 ? absl::StrCat(", ", temps, " unfinished writes deleted") : "");
}

void DiskTier::MakeRoomLocked(int64_t bytes) {
  while (c_.used_bytes + reserved_ + bytes > options_.capacity_bytes && !lru_.empty()) {
    const Entry e = lru_.front();
    ::unlink(FileOf(e.hash).c_str());
    EraseLocked(e.hash);
    ++c_.evictions;
  }
}

void DiskTier::EraseLocked(BlockHash hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) return;
  c_.used_bytes -= it->second->bytes;
  lru_.erase(it->second);
  index_.erase(it);
  if (options_.listener != nullptr) options_.listener->OnTierRemoved(KvTier::kDisk, hash);
}

bool DiskTier::Contains(BlockHash hash) const {
  if (!enabled()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return index_.count(hash) != 0;
}

bool DiskTier::Touch(BlockHash hash) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(hash);
  if (it == index_.end()) return false;
  lru_.splice(lru_.end(), lru_, it->second);
  return true;
}

void DiskTier::Disable(const std::string& why) {
  if (enabled_.exchange(false)) {
    TLOG(ERROR) << "KV disk tier " << path_ << " turned off: " << why
                << "; serving continues without it";
    if (options_.hooks != nullptr) options_.hooks->OnTierDisabled("disk");
    if (options_.listener != nullptr) {
      // Every block is a miss from now on: routers must stop crediting them.
      std::lock_guard<std::mutex> lock(mu_);
      for (const Entry& e : lru_) options_.listener->OnTierRemoved(KvTier::kDisk, e.hash);
    }
  }
}

void DiskTier::Put(const TierBlock& block) {
  if (!enabled() || Touch(block.hash)) return;
  const std::vector<uint8_t> bytes = EncodeTierBlock(block, options_.fingerprint);
  const int64_t size = static_cast<int64_t>(bytes.size());
  if (size > options_.capacity_bytes) return;
  uint64_t temp_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    MakeRoomLocked(size);
    reserved_ += size;
    temp_id = next_temp_++;
  }
  const std::string final_path = FileOf(block.hash);
  const std::string temp = absl::StrCat(final_path, kTempSuffix, temp_id);
  int err = 0;
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    err = errno;
  } else {
    if (!WriteAll(fd, bytes.data(), bytes.size())) err = errno;
    if (::close(fd) != 0 && err == 0) err = errno;
    if (err == 0 && ::rename(temp.c_str(), final_path.c_str()) != 0) err = errno;
    if (err != 0) ::unlink(temp.c_str());
  }
  std::lock_guard<std::mutex> lock(mu_);
  reserved_ -= size;
  if (err != 0) {
    if (DisablesTier(err)) {
      mu_.unlock();
      Disable(absl::StrCat("writing ", temp, ": ", Errno(err)));
      mu_.lock();
    } else {
      TLOG(WARNING) << "KV disk tier: writing " << temp << ": " << Errno(err);
    }
    return;
  }
  EraseLocked(block.hash);
  index_[block.hash] = lru_.insert(lru_.end(), Entry{block.hash, size});
  c_.used_bytes += size;
  c_.bytes_in += size;
  if (options_.listener != nullptr) options_.listener->OnTierStored(KvTier::kDisk, block.hash);
}

std::optional<TierBlock> DiskTier::Get(BlockHash hash, const TierPayloadSource& payload_memory) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!enabled() || index_.count(hash) == 0) {
      ++c_.misses;
      return std::nullopt;
    }
  }
  const std::string file = FileOf(hash);
  std::vector<uint8_t> bytes;
  bool read_ok = false;
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    struct stat st;
    if (::fstat(fd, &st) == 0 && st.st_size >= 0) {
      bytes.resize(static_cast<size_t>(st.st_size));
      size_t done = 0;
      while (done < bytes.size()) {
        const ssize_t r = ::read(fd, bytes.data() + done, bytes.size() - done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        done += static_cast<size_t>(r);
      }
      read_ok = done == bytes.size();
    }
    ::close(fd);
  }
  absl::StatusOr<TierBlock> block = absl::DataLossError("unreadable");
  if (read_ok) block = DecodeTierBlock(bytes, options_.fingerprint, hash, payload_memory);
  std::lock_guard<std::mutex> lock(mu_);
  if (!block.ok()) {
    ++c_.misses;
    if (fd >= 0) {
      ++c_.corrupt;
      TLOG(WARNING) << "KV disk tier: " << file << " failed its checks ("
                    << block.status().message() << "); deleted, the block is recomputed";
      ::unlink(file.c_str());
    }
    EraseLocked(hash);
    return std::nullopt;
  }
  ++c_.hits;
  c_.bytes_out += static_cast<int64_t>(bytes.size());
  auto it = index_.find(hash);
  if (it != index_.end()) lru_.splice(lru_.end(), lru_, it->second);
  return std::move(block).value();
}

KvTierCounters DiskTier::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  KvTierCounters c = c_;
  c.enabled = enabled();
  c.capacity_bytes = options_.capacity_bytes;
  c.blocks = static_cast<int64_t>(index_.size());
  return c;
}

}  // namespace tandem
