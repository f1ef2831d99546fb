#include "common/rpc/shutdown.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <pthread.h>

#include <chrono>
#include <thread>

#include "common/base/log.h"

namespace tandem {

sigset_t BlockTerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  // SIGHUP too, but it is not a termination signal.
  sigset_t blocked = signals;
  sigaddset(&blocked, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
  return signals;
}

int WaitForTerminationSignal(const sigset_t& signals) {
  int sig = 0;
  while (sigwait(&signals, &sig) != 0) {
  }
  return sig;
}

void DrainOnSignal(const sigset_t& signals, grpc::Server* server, absl::Duration timeout,
                   const std::function<int64_t()>& active,
                   const std::function<void()>& start_drain) {
  const int sig = WaitForTerminationSignal(signals);
  TLOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ", draining " << active()
             << " streams";
  start_drain();
  server->GetHealthCheckService()->SetServingStatus(false);
  const absl::Time deadline = absl::Now() + timeout;
  while (active() > 0 && absl::Now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (active() > 0) {
    TLOG(WARNING) << "drain timeout: aborting " << active() << " streams";
  }
}

}  // namespace tandem
