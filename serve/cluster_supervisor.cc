#include "serve/cluster_supervisor.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"

namespace tandem {

namespace {

// The port a child wrote to `path`, or 0 while it has not.
int ReadPort(const std::string& path) {
  std::ifstream in(path);
  int port = 0;
  return in >> port && port > 0 ? port : 0;
}

// The host a scraper on this machine reaches a child's /metrics at, when it listens on `host`.
std::string LocalAddressOf(const std::string& host) {
  if (host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]") return "127.0.0.1";
  if (host.find(':') != std::string::npos && host.front() != '[') return "[" + host + "]";
  return host;
}

}  // namespace

ClusterSupervisor::~ClusterSupervisor() { Stop(absl::Seconds(10)); }

absl::Status ClusterSupervisor::Spawn(Child& child, absl::Duration timeout) {
  const std::string name =
      absl::StrCat(options_.state_dir, "/", child.role, "-", child.index, "-", child.restarts);
  const std::string port_file = name + ".port";
  const std::string metrics_port_file = name + ".metrics-port";
  std::filesystem::remove(port_file);
  std::filesystem::remove(metrics_port_file);
  std::vector<std::string> args = {"/proc/self/exe", child.role,
                                   absl::StrCat("--port=", child.port), "--port-file=" + port_file};
  if (options_.metrics) {
    args.push_back(absl::StrCat("--metrics-port=", child.metrics_port));
    args.push_back("--metrics-port-file=" + metrics_port_file);
    if (!options_.metrics_host.empty()) args.push_back("--metrics-host=" + options_.metrics_host);
  }
  args.insert(args.end(), child.args.begin(), child.args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // The child's environment, built before fork (the child only execs).
  std::vector<std::string> overrides;
  if (options_.child_env) overrides = options_.child_env(child.role, child.index);
  std::vector<char*> envp;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const bool overridden = std::any_of(overrides.begin(), overrides.end(), [&](const auto& o) {
      const size_t eq = o.find('=');
      return entry.substr(0, entry.find('=') + 1) == std::string_view(o).substr(0, eq + 1);
    });
    if (!overridden) envp.push_back(*e);
  }
  for (auto& o : overrides) envp.push_back(o.data());
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve("/proc/self/exe", argv.data(), envp.data());
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
    // A worker starts its /metrics before its gRPC server: both files exist once serving.
    if (const int port = ReadPort(port_file); port > 0) {
      child.port = port;
      std::filesystem::remove(port_file);
      if (options_.metrics) {
        child.metrics_port = ReadPort(metrics_port_file);
        std::filesystem::remove(metrics_port_file);
      }
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
  int index = 0;
  for (const Child& c : children_) index += c.role == role ? 1 : 0;
  for (int i = 0; i < count; ++i) {
    Child child;
    child.role = role;
    child.index = index++;
    child.args = args;
    if (options_.child_args) {
      for (std::string& a : options_.child_args(role, child.index)) child.args.push_back(a);
    }
    if (auto st = Spawn(child, timeout); !st.ok()) return st;
    TLOG(INFO) << "started " << role << " worker pid " << child.pid << " on port " << child.port
               << (options_.metrics ? absl::StrCat(" (metrics on port ", child.metrics_port, ")")
                                    : "");
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

std::string ClusterSupervisor::MetricsTargets() const {
  const std::string host = LocalAddressOf(options_.metrics_host);
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const Child& c : children_) {
    if (c.metrics_port > 0) absl::StrAppend(&out, c.role, " ", host, ":", c.metrics_port, "\n");
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
