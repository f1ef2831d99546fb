#include "tools/cluster_supervisor.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"

namespace tandem {

ClusterSupervisor::~ClusterSupervisor() { Stop(absl::Seconds(10)); }

absl::Status ClusterSupervisor::Spawn(Child& child, absl::Duration timeout) {
  const std::string port_file = absl::StrCat(state_dir_, "/", child.role, "-", getpid(), "-",
                                             children_.size(), "-", child.restarts, ".port");
  std::filesystem::remove(port_file);
  std::vector<std::string> args = {"/proc/self/exe", child.role,
                                   absl::StrCat("--port=", child.port), "--port-file=" + port_file};
  args.insert(args.end(), child.args.begin(), child.args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  child.pid = pid;
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      child.pid = -1;
      return absl::InternalError(absl::StrCat(child.role, " worker exited during startup"));
    }
    std::ifstream in(port_file);
    int port = 0;
    if (in >> port && port > 0) {
      child.port = port;
      std::filesystem::remove(port_file);
      return absl::OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  return absl::DeadlineExceededError(absl::StrCat(child.role, " worker did not start in time"));
}

absl::Status ClusterSupervisor::Launch(const std::string& role, int count,
                                       const std::vector<std::string>& args,
                                       absl::Duration timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < count; ++i) {
    Child child;
    child.role = role;
    child.args = args;
    if (auto st = Spawn(child, timeout); !st.ok()) return st;
    TLOG(INFO) << "started " << role << " worker pid " << child.pid << " on port " << child.port;
    children_.push_back(std::move(child));
  }
  return absl::OkStatus();
}

std::vector<std::string> ClusterSupervisor::Addresses(const std::string& role) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> out;
  for (const Child& c : children_) {
    if (c.role == role) out.push_back(absl::StrCat("127.0.0.1:", c.port));
  }
  return out;
}

void ClusterSupervisor::StartMonitor() {
  monitor_ = std::thread([this] { MonitorLoop(); });
}

void ClusterSupervisor::MonitorLoop() {
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    for (Child& c : children_) {
      int status = 0;
      if (c.pid <= 0 || waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      TLOG(WARNING) << c.role << " worker pid " << c.pid << " on port " << c.port << " died ("
                    << (WIFSIGNALED(status) ? absl::StrCat("signal ", WTERMSIG(status))
                                            : absl::StrCat("exit ", WEXITSTATUS(status)))
                    << "); restarting it";
      c.pid = -1;
      ++c.restarts;
      if (auto st = Spawn(c, absl::Seconds(60)); !st.ok()) {
        TLOG(ERROR) << "restart failed: " << st;
      }
    }
  }
}

void ClusterSupervisor::Stop(absl::Duration timeout) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !monitor_.joinable()) return;
    stopping_ = true;
  }
  if (monitor_.joinable()) monitor_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (Child& c : children_) {
    if (c.pid > 0) kill(c.pid, SIGTERM);
  }
  const absl::Time deadline = absl::Now() + timeout;
  for (Child& c : children_) {
    while (c.pid > 0) {
      int status;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) {
        c.pid = -1;
        break;
      }
      if (absl::Now() > deadline) {
        kill(c.pid, SIGKILL);
        waitpid(c.pid, &status, 0);
        c.pid = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

}  // namespace tandem
