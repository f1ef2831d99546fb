// ClusterLoraCatalog: the adapters a cluster's router serves, loaded and unloaded on its workers
// (fake workers that report adapters and answer Load/UnloadLoraAdapter).

#include "router/cluster_lora_catalog.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/unit/router/fake_registry_worker.h"

namespace tandem {
namespace {

// A worker with LoRA on (--max-cpu-loras 2) whose stats report `reported` (name, path), and
// whose LoadLoraAdapter answers `load_code`. Records the calls it got.
class LoraWorker : public FakeRegistryWorker {
 public:
  LoraWorker(std::string role, std::vector<std::pair<std::string, std::string>> reported,
             grpc::StatusCode load_code)
      : FakeRegistryWorker(std::move(role), "tcp"),
        reported_(std::move(reported)),
        load_code_(load_code) {}

  grpc::ServerWriteReactor<v1::WorkerStats>* WatchStats(grpc::CallbackServerContext* context,
                                                        const v1::StatsRequest* request) override {
    class Watch : public grpc::ServerWriteReactor<v1::WorkerStats> {
     public:
      explicit Watch(const std::vector<std::pair<std::string, std::string>>& reported) {
        message_.set_snapshot(true);
        message_.set_max_cpu_loras(2);
        for (const auto& [name, path] : reported) {
          v1::LoraAdapterState* a = message_.add_lora_adapters();
          a->set_name(name);
          a->set_path(path);
          a->set_cache_key(7);
        }
        StartWrite(&message_);
      }
      void OnWriteDone(bool ok) override {}
      void OnCancel() override { Finish(grpc::Status::CANCELLED); }
      void OnDone() override { delete this; }

     private:
      v1::WorkerStats message_;
    };
    return new Watch(reported_);
  }
  grpc::ServerUnaryReactor* LoadLoraAdapter(grpc::CallbackServerContext* context,
                                            const v1::WorkerLoraRequest* request,
                                            v1::LoraAdapterState* response) override {
    Record(absl::StrCat("load ", request->lora_name(), " ", request->lora_path()));
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(load_code_ == grpc::StatusCode::OK
                        ? grpc::Status::OK
                        : grpc::Status(load_code_, "bad adapter files"));
    return reactor;
  }
  grpc::ServerUnaryReactor* UnloadLoraAdapter(grpc::CallbackServerContext* context,
                                              const v1::WorkerLoraRequest* request,
                                              v1::LoraAdapterState* response) override {
    Record(absl::StrCat("unload ", request->lora_name()));
    response->set_in_use(1);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  std::vector<std::string> calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }

 private:
  void Record(std::string call) {
    std::lock_guard<std::mutex> lock(mu_);
    calls_.push_back(std::move(call));
  }
  std::vector<std::pair<std::string, std::string>> reported_;
  grpc::StatusCode load_code_;
  std::mutex mu_;
  std::vector<std::string> calls_;
};

struct LoraWorkerServer {
  LoraWorker service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
  LoraWorkerServer(std::string role, std::vector<std::pair<std::string, std::string>> reported,
                   grpc::StatusCode load_code = grpc::StatusCode::OK)
      : service(std::move(role), std::move(reported), load_code) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    address = absl::StrCat("127.0.0.1:", port);
  }
  ~LoraWorkerServer() { server->Shutdown(std::chrono::system_clock::now()); }
};

class ClusterLoraCatalogTest : public ::testing::Test {
 protected:
  void Start(LoraWorkerServer* decode, LoraWorkerServer* prefill) {
    RegistryOptions o;
    o.decode_addresses = {decode->address};
    o.prefill_addresses = {prefill->address};
    o.resolve_interval = absl::Milliseconds(50);
    registry_ = std::make_unique<WorkerRegistry>(o);
    registry_->Start();
    ASSERT_TRUE(registry_->WaitForWorkers(1, 1, absl::Seconds(10)));
    // The stats (LoRA on) have arrived with the stream that made them healthy.
  }
  void TearDown() override {
    if (registry_) registry_->Stop();
  }
  std::unique_ptr<WorkerRegistry> registry_;
};

TEST_F(ClusterLoraCatalogTest, LoadsAndUnloadsOnEveryWorker) {
  LoraWorkerServer decode("decode", {});
  LoraWorkerServer prefill("prefill", {});
  Start(&decode, &prefill);
  bool allowed = false;
  ClusterLoraCatalog catalog(registry_.get(), [&] { return allowed; });
  EXPECT_EQ(catalog.Load("sql", "/a/sql").code(), absl::StatusCode::kFailedPrecondition);
  allowed = true;
  ASSERT_TRUE(catalog.Load("sql", "/a/sql").ok());
  EXPECT_TRUE(catalog.Has("sql"));
  EXPECT_EQ(catalog.Path("sql"), "/a/sql");
  EXPECT_EQ(decode.service.calls(), (std::vector<std::string>{"load sql /a/sql"}));
  EXPECT_EQ(prefill.service.calls(), (std::vector<std::string>{"load sql /a/sql"}));
  EXPECT_EQ(catalog.Load("sql", "/a/sql").code(), absl::StatusCode::kAlreadyExists);
  auto in_use = catalog.Unload("sql");
  ASSERT_TRUE(in_use.ok()) << in_use.status();
  EXPECT_EQ(*in_use, 2);  // one request still on each worker
  EXPECT_FALSE(catalog.Has("sql"));
  EXPECT_EQ(catalog.Path("sql"), "");
  EXPECT_EQ(prefill.service.calls().back(), "unload sql");
  EXPECT_EQ(catalog.Unload("sql").status().code(), absl::StatusCode::kNotFound);
}

// A worker refusing the adapter fails the load with its message, and the workers that took it
// unload it again.
TEST_F(ClusterLoraCatalogTest, AWorkersRefusalFailsTheLoadAndRollsBack) {
  LoraWorkerServer decode("decode", {});
  LoraWorkerServer prefill("prefill", {}, grpc::StatusCode::INVALID_ARGUMENT);
  Start(&decode, &prefill);
  ClusterLoraCatalog catalog(registry_.get(), [] { return true; });
  const absl::Status st = catalog.Load("sql", "/a/sql");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find(prefill.address), std::string::npos) << st;
  EXPECT_NE(st.message().find("bad adapter files"), std::string::npos) << st;
  EXPECT_EQ(decode.service.calls(), (std::vector<std::string>{"load sql /a/sql", "unload sql"}));
  EXPECT_FALSE(catalog.Has("sql"));
  EXPECT_TRUE(catalog.List().empty());
}

// --lora-modules, and the adapters workers report (their own --lora-modules): listed and
// selectable; one unloaded through the router stays gone while a worker still reports it.
TEST_F(ClusterLoraCatalogTest, ModulesAndReportedAdapters) {
  LoraWorkerServer decode("decode", {{"own", "/w/own"}});
  LoraWorkerServer prefill("prefill", {});
  Start(&decode, &prefill);
  ClusterLoraCatalog catalog(registry_.get(), [] { return true; });
  EXPECT_EQ(catalog.AddModules({"noequals"}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(catalog.AddModules({"a=/x", "a=/y"}).code(), absl::StatusCode::kInvalidArgument);
  ClusterLoraCatalog fresh(registry_.get(), [] { return true; });
  ASSERT_TRUE(fresh.AddModules({"sql=/r/sql"}).ok());
  std::vector<std::string> names;
  for (const auto& e : fresh.List()) names.push_back(e.name + "=" + e.path);
  EXPECT_EQ(names, (std::vector<std::string>{"own=/w/own", "sql=/r/sql"}));
  EXPECT_EQ(fresh.Path("own"), "/w/own");
  ASSERT_TRUE(fresh.Unload("own").ok());
  EXPECT_FALSE(fresh.Has("own"));                 // the fake still reports it
  ASSERT_TRUE(fresh.Load("own", "/w/own").ok());  // loading it again brings it back
  EXPECT_TRUE(fresh.Has("own"));
}

}  // namespace
}  // namespace tandem
