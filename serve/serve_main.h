#pragma once

namespace tandem {

// `tandem serve`: the router and one worker in this process, or with --prefill-workers /
// --decode-workers a local disaggregated cluster (worker processes under a ClusterSupervisor).
int RunServe(int argc, char** argv);

// `tandem worker --role prefill|decode|both`: a worker process holding one role or both.
int RunWorker(int argc, char** argv);

}  // namespace tandem
