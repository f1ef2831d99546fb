#include "common/http/http_transport.h"

#include <map>
#include <mutex>
#include <thread>

#include "common/base/log.h"
#include "common/http/http_connection.h"

namespace tandem {

bool HttpRequest::has_header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (beast::iequals(k, beast::string_view(name.data(), name.size()))) return true;
  }
  return false;
}

std::string HttpRequest::get_header_value(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (beast::iequals(k, beast::string_view(name.data(), name.size()))) return v;
  }
  return "";
}

HttpResponder::HttpResponder(std::weak_ptr<HttpConnectionBase> connection, uint64_t serial,
                             Poster post)
    : connection_(std::move(connection)), serial_(serial), post_(std::move(post)) {}

void HttpResponder::Send(int status, std::string content_type, std::string body,
                         HttpHeaders headers) {
  post_([c = connection_, s = serial_, status, t = std::move(content_type), b = std::move(body),
         h = std::move(headers)]() mutable {
    if (auto conn = c.lock()) conn->DoSend(s, status, std::move(t), std::move(b), std::move(h));
  });
}

void HttpResponder::StartChunked(int status, std::string content_type, HttpHeaders headers) {
  post_([c = connection_, s = serial_, status, t = std::move(content_type),
         h = std::move(headers)]() mutable {
    if (auto conn = c.lock()) conn->DoStartChunked(s, status, std::move(t), std::move(h));
  });
}

void HttpResponder::Write(std::string data) {
  post_([c = connection_, s = serial_, d = std::move(data)]() mutable {
    if (auto conn = c.lock()) conn->DoWrite(s, std::move(d));
  });
}

void HttpResponder::Finish() {
  post_([c = connection_, s = serial_] {
    if (auto conn = c.lock()) conn->DoFinish(s);
  });
}

void HttpResponder::Post(std::function<void()> fn) { post_(std::move(fn)); }

void HttpResponder::SetTicker(absl::Duration interval, std::function<void()> fn) {
  post_([c = connection_, s = serial_, interval, f = std::move(fn)]() mutable {
    if (auto conn = c.lock()) conn->DoSetTicker(s, interval, std::move(f));
  });
}

void HttpResponder::SetOnClose(std::function<void()> fn) {
  post_([c = connection_, s = serial_, f = std::move(fn)]() mutable {
    auto conn = c.lock();
    if (conn == nullptr || !conn->DoSetOnClose(s, f)) f();
  });
}

namespace {

// Posts onto an event loop until the loop is about to be destroyed; shared by every responder,
// which may outlive the transport's threads (a gRPC callback posting late).
class PostGate {
 public:
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
  }
  template <class Executor>
  void Post(const Executor& ex, std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    if (open_) net::post(ex, std::move(fn));
  }

 private:
  std::mutex mu_;
  bool open_ = true;
};

}  // namespace

class HttpTransport::Impl : public HttpConnectionHost {
 public:
  Impl(const HttpTransportOptions& options, std::vector<HttpRoute> routes, HttpErrorPage page)
      : options_(options),
        routes_(std::move(routes)),
        error_page_(std::move(page)),
        gate_(std::make_shared<PostGate>()),
        ioc_(std::make_unique<net::io_context>(options.io_threads)),
        acceptor_(std::make_unique<Tcp::acceptor>(net::make_strand(*ioc_))),
        retry_(std::make_unique<net::steady_timer>(acceptor_->get_executor())),
        pool_(std::make_unique<net::thread_pool>(options.handler_threads)) {}

  ~Impl() override { Stop(); }

  absl::Status Listen() {
    if (!options_.tls_cert.empty()) {
      ssl_ = std::make_unique<net::ssl::context>(net::ssl::context::tls_server);
      ssl_->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                        net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 |
                        net::ssl::context::no_tlsv1_1);
      beast::error_code ec;
      ssl_->use_certificate_chain_file(options_.tls_cert, ec);
      if (!ec) ssl_->use_private_key_file(options_.tls_key, net::ssl::context::pem, ec);
      if (!ec && !options_.tls_client_ca.empty()) {
        ssl_->load_verify_file(options_.tls_client_ca, ec);
        ssl_->set_verify_mode(net::ssl::verify_peer | net::ssl::verify_fail_if_no_peer_cert);
      }
      if (ec) {
        return absl::InvalidArgumentError(absl::StrCat(
            options_.name, ": cannot load the TLS certificate/key (", options_.tls_cert, ", ",
            options_.tls_key, ", ", options_.tls_client_ca, "): ", ec.message()));
      }
    } else if (!options_.tls_key.empty() || !options_.tls_client_ca.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(options_.name, ": a TLS key or client CA needs a server certificate"));
    }
    beast::error_code ec;
    // An address ("127.0.0.1", "::", "[::1]") or a name, which listens on its first address.
    std::string host = options_.host;
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
      host = host.substr(1, host.size() - 2);
    }
    net::ip::address address = net::ip::make_address(host, ec);
    if (ec) {
      Tcp::resolver resolver(*ioc_);
      const auto found = resolver.resolve(host, "", Tcp::resolver::passive, ec);
      if (ec || found.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(options_.name, ": cannot resolve host ", options_.host));
      }
      address = found.begin()->endpoint().address();
    }
    const Tcp::endpoint endpoint(address, static_cast<uint16_t>(options_.port));
    acceptor_->open(endpoint.protocol(), ec);
    if (!ec) acceptor_->set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_->bind(endpoint, ec);
    if (!ec) acceptor_->listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat(options_.name, ": cannot listen on ",
                                                 options_.host, ":", options_.port, ": ",
                                                 ec.message()));
    }
    port_ = acceptor_->local_endpoint().port();
    Accept();
    for (int i = 0; i < options_.io_threads; ++i) threads_.emplace_back([this] { ioc_->run(); });
    return absl::OkStatus();
  }

  int port() const { return port_; }

  void Stop() {
    std::call_once(stopped_, [this] {
      // Close the listener and every connection on their strands; on-close callbacks cancel
      // the requests still answering.
      net::post(acceptor_->get_executor(), [this] {
        beast::error_code ignored;
        acceptor_->close(ignored);
        retry_->cancel();
      });
      std::vector<std::weak_ptr<HttpConnectionBase>> all;
      {
        std::lock_guard<std::mutex> lock(mu_);
        all = connections_;
      }
      for (auto& weak : all) {
        if (auto c = weak.lock()) net::post(c->strand(), [c] { c->Close(); });
      }
      pool_->join();
      for (int i = 0; i < 200; ++i) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (open_ == 0) break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ioc_->stop();
      for (auto& t : threads_) t.join();
      gate_->Close();
      // Pending handlers (and the connections they hold) go with the loop, before the TLS
      // context and the limits' counters they use.
      retry_.reset();
      acceptor_.reset();
      ioc_.reset();
      ssl_.reset();
    });
  }

  // HttpConnectionHost.
  const HttpTransportOptions& options() const override { return options_; }
  HttpHooks* hooks() const override { return options_.hooks; }
  std::string ErrorPage(int status, const std::string& message) override {
    return error_page_(status, message);
  }
  HttpResponder::Poster PosterFor(net::any_io_executor strand) override {
    return [gate = gate_, strand](std::function<void()> fn) { gate->Post(strand, std::move(fn)); };
  }
  void Dispatch(HttpRequest request, std::shared_ptr<HttpResponder> responder) override {
    bool path_known = false;
    for (const HttpRoute& route : routes_) {
      if (route.path != request.path) continue;
      path_known = true;
      if (route.method != request.method) continue;
      net::post(*pool_, [handler = &route.handler, page = &error_page_, name = &options_.name,
                         request = std::move(request), responder]() {
        try {
          (*handler)(request, responder);
        } catch (const std::exception& e) {
          TLOG(ERROR) << *name << " handler of " << request.path << ": " << e.what();
          responder->Send(500, "application/json", (*page)(500, "internal error"));
        }
      });
      return;
    }
    const int status = path_known ? 405 : 404;
    responder->Send(status, "application/json",
                    error_page_(status, path_known ? "method not allowed" : "no such endpoint"));
  }
  std::optional<HttpRefusal> Admit(const HttpRequest& head) override {
    for (const HttpRoute& route : routes_) {
      if (route.path == head.path && route.method == head.method) {
        return route.admission ? route.admission(head) : std::nullopt;
      }
    }
    return std::nullopt;  // Dispatch answers 404 / 405
  }
  void Released(const std::string& client) override {
    std::lock_guard<std::mutex> lock(mu_);
    --open_;
    if (auto it = per_client_.find(client); it != per_client_.end() && --it->second == 0) {
      per_client_.erase(it);
    }
    if (++released_since_sweep_ >= 1024) {
      released_since_sweep_ = 0;
      std::erase_if(connections_, [](const auto& w) { return w.expired(); });
    }
  }

 private:
  void Accept() {
    acceptor_->async_accept(net::make_strand(*ioc_),
                            [this](beast::error_code ec, Tcp::socket socket) {
                              if (!acceptor_->is_open()) return;
                              if (ec) {
                                // Out of descriptors (or a transient error): count, breathe, retry.
                                if (options_.hooks != nullptr)
                                  options_.hooks->Rejected("accept_failed");
                                retry_->expires_after(std::chrono::milliseconds(50));
                                retry_->async_wait([this](beast::error_code e) {
                                  if (!e) Accept();
                                });
                                return;
                              }
                              OnAccepted(std::move(socket));
                              Accept();
                            });
  }

  void OnAccepted(Tcp::socket socket) {
    beast::error_code ec;
    const auto remote = socket.remote_endpoint(ec);
    if (ec) return;
    std::string client = remote.address().to_string();
    const char* refused = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (open_ >= options_.max_connections) {
        refused = "max_connections";
      } else if (options_.max_connections_per_client > 0 &&
                 per_client_[client] >= options_.max_connections_per_client) {
        refused = "per_client";
      } else {
        ++open_;
        ++per_client_[client];
      }
    }
    if (refused != nullptr) {
      if (options_.hooks != nullptr) options_.hooks->Rejected(refused);
      socket.close(ec);
      return;
    }
    socket.set_option(Tcp::no_delay(true), ec);
    net::any_io_executor strand = socket.get_executor();  // accepted onto its own strand
    std::shared_ptr<HttpConnectionBase> conn;
    if (ssl_ != nullptr) {
      auto c = std::make_shared<HttpConnection<SslStream>>(this, strand, client, std::move(socket),
                                                           *ssl_);
      conn = c;
      net::dispatch(strand, [c = c] { c->Start(); });
    } else {
      auto c = std::make_shared<HttpConnection<beast::tcp_stream>>(this, strand, client,
                                                                   std::move(socket));
      conn = c;
      net::dispatch(strand, [c = c] { c->Start(); });
    }
    std::lock_guard<std::mutex> lock(mu_);
    connections_.push_back(conn);
  }

  const HttpTransportOptions options_;
  const std::vector<HttpRoute> routes_;
  const HttpErrorPage error_page_;
  std::mutex mu_;
  int open_ = 0;
  std::map<std::string, int> per_client_;
  std::vector<std::weak_ptr<HttpConnectionBase>> connections_;
  int released_since_sweep_ = 0;
  std::shared_ptr<PostGate> gate_;
  int port_ = 0;
  std::once_flag stopped_;
  std::unique_ptr<net::ssl::context> ssl_;
  std::unique_ptr<net::io_context> ioc_;
  std::unique_ptr<Tcp::acceptor> acceptor_;
  std::unique_ptr<net::steady_timer> retry_;
  std::unique_ptr<net::thread_pool> pool_;
  std::vector<std::thread> threads_;
};

HttpTransport::HttpTransport(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpTransport::~HttpTransport() { Stop(); }

absl::StatusOr<std::unique_ptr<HttpTransport>> HttpTransport::Start(
    const HttpTransportOptions& options, std::vector<HttpRoute> routes, HttpErrorPage error_page) {
  auto impl = std::make_unique<Impl>(options, std::move(routes), std::move(error_page));
  if (absl::Status st = impl->Listen(); !st.ok()) return st;
  return std::unique_ptr<HttpTransport>(new HttpTransport(std::move(impl)));
}

int HttpTransport::port() const { return impl_->port(); }

void HttpTransport::Stop() { impl_->Stop(); }

}  // namespace tandem
