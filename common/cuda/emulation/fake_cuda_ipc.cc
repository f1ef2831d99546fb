// CUDA IPC for the emulator (fake_cuda.h): shareable "device" memory is a memfd mapped
// MAP_SHARED, so another process on the same machine maps the same pages. A handle names the
// owner process, the memfd's fd number there and its inode (so a reused fd number is caught),
// the size and the emulated GPU; the opener maps /proc/<pid>/fd/<fd>. Memory stays valid in the
// opener after the owner exits or frees it (as the runtime keeps an imported allocation alive),
// until cudaIpcCloseMemHandle.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "common/cuda/emulation/fake_cuda.h"

namespace tandem::cuda_emu {
namespace {

constexpr uint32_t kHandleMagic = 0x54495043;  // "TIPC"

struct Shared {
  int fd = -1;
  size_t bytes = 0;
  uint64_t inode = 0;
};

struct Handle {
  uint32_t magic;
  int32_t pid;
  int32_t fd;
  uint32_t reserved;
  uint64_t inode;
  uint64_t bytes;
  char device[CUDA_IPC_HANDLE_SIZE - 32];  // the emulated GPU's name, NUL-padded
};
static_assert(sizeof(Handle) == CUDA_IPC_HANDLE_SIZE);

std::mutex g_mu;
std::map<void*, Shared>& Exported() {
  static auto* m = new std::map<void*, Shared>();
  return *m;
}
std::map<void*, size_t>& Opened() {
  static auto* m = new std::map<void*, size_t>();
  return *m;
}

size_t MapBytes(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

}  // namespace

const char* EmulatedGpuName() {
  static const std::string* name = [] {
    const char* env = std::getenv("TANDEM_EMULATED_GPU");
    return new std::string(env != nullptr && env[0] != '\0' ? env : "0");
  }();
  return name->c_str();
}

void* SharedAlloc(size_t bytes) {
  const int fd = memfd_create("tandem-emulated-gpu", MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st;
  if (ftruncate(fd, static_cast<off_t>(MapBytes(bytes))) != 0 || fstat(fd, &st) != 0) {
    close(fd);
    return nullptr;
  }
  void* p = mmap(nullptr, MapBytes(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  Exported()[p] = Shared{fd, bytes, static_cast<uint64_t>(st.st_ino)};
  return p;
}

bool SharedFree(void* ptr) {
  Shared s;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = Exported().find(ptr);
    if (it == Exported().end()) return false;
    s = it->second;
    Exported().erase(it);
  }
  munmap(ptr, MapBytes(s.bytes));
  close(s.fd);
  return true;
}

}  // namespace tandem::cuda_emu

using tandem::cuda_emu::Exported;
using tandem::cuda_emu::Handle;
using tandem::cuda_emu::Opened;

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* handle, void* dev_ptr) {
  std::lock_guard<std::mutex> lock(tandem::cuda_emu::g_mu);
  auto it = Exported().find(dev_ptr);
  if (it == Exported().end()) return cudaErrorInvalidValue;
  Handle h;
  std::memset(&h, 0, sizeof h);
  h.magic = tandem::cuda_emu::kHandleMagic;
  h.pid = static_cast<int32_t>(getpid());
  h.fd = it->second.fd;
  h.inode = it->second.inode;
  h.bytes = it->second.bytes;
  std::strncpy(h.device, tandem::cuda_emu::EmulatedGpuName(), sizeof h.device - 1);
  std::memcpy(handle->reserved, &h, sizeof h);
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void** dev_ptr, cudaIpcMemHandle_t handle, unsigned int) {
  Handle h;
  std::memcpy(&h, handle.reserved, sizeof h);
  if (h.magic != tandem::cuda_emu::kHandleMagic || h.bytes == 0) return cudaErrorInvalidValue;
  if (h.pid == static_cast<int32_t>(getpid())) return cudaErrorInvalidResourceHandle;
  h.device[sizeof h.device - 1] = '\0';
  if (std::strcmp(h.device, tandem::cuda_emu::EmulatedGpuName()) != 0) {
    return cudaErrorInvalidDevice;
  }
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return cudaErrorMapBufferObjectFailed;
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != h.inode) {
    close(fd);
    return cudaErrorMapBufferObjectFailed;
  }
  const size_t bytes = tandem::cuda_emu::MapBytes(h.bytes);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);  // the mapping keeps the memory
  if (p == MAP_FAILED) return cudaErrorMapBufferObjectFailed;
  std::lock_guard<std::mutex> lock(tandem::cuda_emu::g_mu);
  Opened()[p] = bytes;
  *dev_ptr = p;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* dev_ptr) {
  size_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(tandem::cuda_emu::g_mu);
    auto it = Opened().find(dev_ptr);
    if (it == Opened().end()) return cudaErrorInvalidValue;
    bytes = it->second;
    Opened().erase(it);
  }
  munmap(dev_ptr, bytes);
  return cudaSuccess;
}
