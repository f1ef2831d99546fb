#pragma once

// Internals of http_transport.cc: one connection's state machine, a template over the stream
// (plain TCP or TLS). Everything here runs on the connection's strand.

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <linux/sockios.h>
#include <sys/ioctl.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/http/http_transport.h"

namespace tandem {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using Tcp = net::ip::tcp;
using SslStream = beast::ssl_stream<beast::tcp_stream>;

// The connection-level interface HttpResponder reaches (on the strand, by serial of the
// request the call belongs to; calls for an earlier request are ignored).
class HttpConnectionBase : public std::enable_shared_from_this<HttpConnectionBase> {
 public:
  virtual ~HttpConnectionBase() = default;
  virtual void DoSend(uint64_t serial, int status, std::string content_type, std::string body,
                      HttpHeaders headers) = 0;
  virtual void DoStartChunked(uint64_t serial, int status, std::string content_type,
                              HttpHeaders headers) = 0;
  virtual void DoWrite(uint64_t serial, std::string data) = 0;
  virtual void DoFinish(uint64_t serial) = 0;
  virtual void DoSetTicker(uint64_t serial, absl::Duration interval, std::function<void()> fn) = 0;
  // False when that response is over (the caller then runs `fn` itself).
  virtual bool DoSetOnClose(uint64_t serial, std::function<void()> fn) = 0;
  virtual void Close() = 0;
  virtual net::any_io_executor strand() const = 0;
};

// What connections share with the listener (HttpTransport::Impl implements it).
class HttpConnectionHost {
 public:
  virtual ~HttpConnectionHost() = default;
  virtual const HttpTransportOptions& options() const = 0;
  virtual HttpHooks* hooks() const = 0;
  // Routes the request: runs its handler on the handler pool, or answers 404/405 itself via
  // the responder.
  virtual void Dispatch(HttpRequest request, std::shared_ptr<HttpResponder> responder) = 0;
  // Asks the route's admission about a request whose headers are in (its body is unread).
  virtual std::optional<HttpRefusal> Admit(const HttpRequest& head) = 0;
  virtual std::string ErrorPage(int status, const std::string& message) = 0;
  virtual HttpResponder::Poster PosterFor(net::any_io_executor strand) = 0;
  // The connection from `client` ended (counts for the limits).
  virtual void Released(const std::string& client) = 0;
};

template <class Stream>
class HttpConnection : public HttpConnectionBase {
 public:
  static constexpr bool kTls = std::is_same_v<Stream, SslStream>;
  using Strand = net::any_io_executor;

  template <class... Args>
  HttpConnection(HttpConnectionHost* host, Strand strand, std::string client, Args&&... args)
      : host_(host),
        options_(host->options()),
        strand_(strand),
        client_(std::move(client)),
        stream_(std::forward<Args>(args)...),
        ticker_(strand) {
    if (host_->hooks() != nullptr) host_->hooks()->ConnectionOpened();
  }

  ~HttpConnection() override {
    if (host_->hooks() != nullptr) host_->hooks()->ConnectionClosed();
    host_->Released(client_);
  }

  Strand strand() const override { return strand_; }

  void Start() {
    header_deadline_ = Deadline(options_.header_timeout_s);
    if constexpr (kTls) {
      Lowest().expires_at(header_deadline_);
      stream_.async_handshake(net::ssl::stream_base::server, [self = Self()](beast::error_code ec) {
        if (ec) return self->Fail(ec, "header");
        self->ReadRequest();
      });
    } else {
      ReadRequest();
    }
  }

  void DoSend(uint64_t serial, int status, std::string content_type, std::string body,
              HttpHeaders headers) override {
    if (closed_ || serial != serial_ || started_) return;
    started_ = done_ = true;
    std::string out = Head(status, content_type, headers);
    absl::StrAppend(&out, "Content-Length: ", body.size(), "\r\n\r\n");
    out += body;
    Queue(std::move(out), /*bounded=*/false);
  }

  void DoStartChunked(uint64_t serial, int status, std::string content_type,
                      HttpHeaders headers) override {
    if (closed_ || serial != serial_ || started_) return;
    started_ = true;
    // HTTP/1.0 has no chunked encoding: the body runs to the close.
    if (!chunked_) keep_alive_ = false;
    Queue(Head(status, content_type, headers) +
              (chunked_ ? "Transfer-Encoding: chunked\r\n\r\n" : "\r\n"),
          false);
  }

  void DoWrite(uint64_t serial, std::string data) override {
    if (closed_ || serial != serial_ || !started_ || done_ || data.empty()) return;
    if (!chunked_) return Queue(std::move(data), /*bounded=*/true);
    std::string chunk = absl::StrCat(absl::Hex(data.size()), "\r\n");
    chunk += data;
    chunk += "\r\n";
    Queue(std::move(chunk), /*bounded=*/true);
  }

  void DoFinish(uint64_t serial) override {
    if (closed_ || serial != serial_ || !started_ || done_) return;
    done_ = true;
    if (!chunked_) {
      if (!writing_) WriteNext();  // else the write in flight ends the response
      return;
    }
    Queue("0\r\n\r\n", false);
  }

  void DoSetTicker(uint64_t serial, absl::Duration interval, std::function<void()> fn) override {
    if (closed_ || serial != serial_ || done_) return;
    tick_fn_ = std::move(fn);
    tick_interval_ = interval;
    ArmTicker();
  }

  bool DoSetOnClose(uint64_t serial, std::function<void()> fn) override {
    if (closed_ || serial != serial_ || done_) return false;
    on_close_ = std::move(fn);
    return true;
  }

  // Closes the socket (pending operations end with errors and are ignored); a response still
  // in progress gets its on-close callback.
  void Close() override {
    if (closed_) return;
    closed_ = true;
    std::shared_ptr<HttpConnectionBase> keep = std::move(answering_);
    ticker_.cancel();
    tick_fn_ = nullptr;
    beast::error_code ignored;
    Lowest().socket().close(ignored);
    std::function<void()> on_close = std::move(on_close_);
    on_close_ = nullptr;
    if (on_close && !done_) on_close();
  }

 private:
  using Clock = std::chrono::steady_clock;

  std::shared_ptr<HttpConnection> Self() {
    return std::static_pointer_cast<HttpConnection>(shared_from_this());
  }
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }
  static Clock::time_point Deadline(double seconds) {
    return Clock::now() + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  }

  // A failed socket operation: counts a timeout of `kind`, then closes.
  void Fail(beast::error_code ec, const char* kind) {
    if (ec == beast::error::timeout && !closed_ && host_->hooks() != nullptr) {
      host_->hooks()->TimedOut(kind);
    }
    Close();
  }

  void ReadRequest() {
    if (closed_) return;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(options_.max_header_bytes));
    parser_->body_limit(static_cast<uint64_t>(options_.max_body_bytes));
    if (buffer_.size() > 0) return ReadHeader();
    // Waiting for the first byte: a kept-alive connection is idle; a new one is on its header
    // deadline.
    const bool idle = served_ > 0;
    Lowest().expires_at(idle ? Deadline(options_.idle_timeout_s) : header_deadline_);
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = Self(), idle](beast::error_code ec, size_t n) {
                              if (ec) return self->Fail(ec, idle ? "idle" : "header");
                              self->buffer_.commit(n);
                              if (idle)
                                self->header_deadline_ = Deadline(self->options_.header_timeout_s);
                              self->ReadHeader();
                            });
  }

  void ReadHeader() {
    Lowest().expires_at(header_deadline_);
    bhttp::async_read_header(stream_, buffer_, *parser_,
                             [self = Self()](beast::error_code ec, size_t) {
                               if (ec) return self->ReadError(ec, "header");
                               self->OnHeader();
                             });
  }

  void ReadError(beast::error_code ec, const char* kind) {
    if (closed_) return;
    if (ec == bhttp::error::header_limit) {
      return Refuse(431, "the request headers are too large", "header_too_large");
    }
    if (ec == bhttp::error::body_limit) {
      return Refuse(413,
                    absl::StrCat("the request body is too large (more than ",
                                 options_.max_body_bytes, " bytes)"),
                    "body_too_large");
    }
    if (ec.category() == bhttp::make_error_code(bhttp::error::end_of_stream).category() &&
        ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
      return Refuse(400, "malformed HTTP request", "malformed");
    }
    Fail(ec, kind);
  }

  void OnHeader() {
    const auto& req = parser_->get();
    if (std::distance(req.begin(), req.end()) > options_.max_headers) {
      return Refuse(431, "too many request headers", "too_many_headers");
    }
    // The route's admission (the API key) before a byte of the body is read.
    if (std::optional<HttpRefusal> refused = host_->Admit(RequestHead(req)); refused.has_value()) {
      return Refuse(refused->status, refused->message, refused->reason.c_str());
    }
    body_deadline_base_ = Deadline(options_.body_timeout_s);
    if (!parser_->is_done() && beast::iequals(req[bhttp::field::expect], "100-continue")) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      Lowest().expires_at(Deadline(options_.write_timeout_s));
      return net::async_write(stream_, net::buffer(kContinue),
                              [self = Self()](beast::error_code ec, size_t) {
                                if (ec) return self->Fail(ec, "write");
                                self->ReadBody();
                              });
    }
    ReadBody();
  }

  void ReadBody() {
    if (closed_) return;
    if (parser_->is_done()) return Dispatch();
    // The whole body by body_timeout, extended by what arrived at the minimum rate.
    const int64_t got = static_cast<int64_t>(parser_->get().body().size());
    const int64_t rate = std::max<int64_t>(options_.body_min_rate, 1);
    Lowest().expires_at(body_deadline_base_ + std::chrono::milliseconds(got * 1000 / rate));
    bhttp::async_read_some(stream_, buffer_, *parser_,
                           [self = Self()](beast::error_code ec, size_t) {
                             if (ec) return self->ReadError(ec, "body");
                             self->ReadBody();
                           });
  }

  void Dispatch() {
    Lowest().expires_never();
    bhttp::request<bhttp::string_body> req = parser_->release();
    parser_.reset();
    ++served_;
    ++serial_;
    answering_ = shared_from_this();
    keep_alive_ = req.keep_alive() && served_ < options_.max_requests_per_connection;
    chunked_ = req.version() >= 11;
    HttpRequest r = RequestHead(req);
    r.body = std::move(req.body());
    host_->Dispatch(std::move(r), std::make_shared<HttpResponder>(weak_from_this(), serial_,
                                                                  host_->PosterFor(strand_)));
  }

  // The request line and headers of `req` (no body).
  HttpRequest RequestHead(const bhttp::request<bhttp::string_body>& req) const {
    HttpRequest r;
    r.method = std::string(req.method_string());
    const std::string target(req.target());
    r.path = target.substr(0, target.find('?'));
    r.remote_address = client_;
    for (const auto& field : req) {
      r.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    return r;
  }

  // Answers a request the transport refuses, then closes (the rest of it is not read).
  void Refuse(int status, const std::string& message, const char* reason) {
    if (host_->hooks() != nullptr) host_->hooks()->Rejected(reason);
    ++serial_;
    keep_alive_ = false;
    linger_ = true;
    DoSend(serial_, status, "application/json", host_->ErrorPage(status, message), {});
  }

  std::string Head(int status, const std::string& content_type, const HttpHeaders& headers) {
    std::string out =
        absl::StrCat("HTTP/1.1 ", status, " ",
                     std::string(bhttp::obsolete_reason(static_cast<bhttp::status>(status))),
                     "\r\nContent-Type: ", content_type, "\r\n");
    for (const auto& [name, value] : headers) absl::StrAppend(&out, name, ": ", value, "\r\n");
    if (!keep_alive_) out += "Connection: close\r\n";
    return out;
  }

  // Bytes the kernel holds for the client and it has not taken (unacknowledged): counted with
  // ours, so a client that stops reading is noticed even while socket buffers grow.
  size_t KernelUnread() {
    int n = 0;
    if (ioctl(Lowest().socket().native_handle(), SIOCOUTQ, &n) != 0 || n < 0) return 0;
    return static_cast<size_t>(n);
  }

  // `bounded`: streamed data, which may overflow the buffer of a client that stops reading.
  void Queue(std::string data, bool bounded) {
    queued_bytes_ += data.size();
    if (bounded &&
        queued_bytes_ + KernelUnread() > static_cast<size_t>(options_.max_buffered_bytes)) {
      if (host_->hooks() != nullptr) host_->hooks()->TimedOut("buffer_overflow");
      return Close();
    }
    out_.push_back(std::move(data));
    if (!writing_) WriteNext();
  }

  void WriteNext() {
    if (closed_) return;
    if (out_.empty()) {
      writing_ = false;
      if (done_) AfterResponse();
      return;
    }
    writing_ = true;
    sending_.clear();
    while (!out_.empty()) {
      sending_ += out_.front();
      out_.pop_front();
    }
    Lowest().expires_at(Deadline(options_.write_timeout_s));
    net::async_write(stream_, net::buffer(sending_),
                     [self = Self()](beast::error_code ec, size_t n) {
                       if (ec) return self->Fail(ec, "write");
                       self->queued_bytes_ -= n;
                       self->WriteNext();
                     });
  }

  void AfterResponse() {
    answering_.reset();  // the caller's completion handler holds this
    Lowest().expires_never();
    ticker_.cancel();
    tick_fn_ = nullptr;
    on_close_ = nullptr;
    started_ = done_ = false;
    if (keep_alive_) return ReadRequest();
    if (linger_) return Linger();
    if constexpr (kTls) {
      Lowest().expires_after(std::chrono::seconds(1));
      stream_.async_shutdown([self = Self()](beast::error_code) { self->Close(); });
    } else {
      beast::error_code ignored;
      Lowest().socket().shutdown(Tcp::socket::shutdown_send, ignored);
      Close();
    }
  }

  // After a refusal: half-closes and reads (and drops) what the client still sends for a
  // moment, so the refusal is not lost to a reset of unread data.
  void Linger() {
    if (linger_deadline_ == Clock::time_point()) {
      linger_deadline_ = Deadline(2);
      if constexpr (!kTls) {
        beast::error_code ignored;
        Lowest().socket().shutdown(Tcp::socket::shutdown_send, ignored);
      }
    }
    buffer_.clear();
    Lowest().expires_at(linger_deadline_);
    stream_.async_read_some(buffer_.prepare(65536), [self = Self()](beast::error_code ec, size_t) {
      if (ec) return self->Close();
      self->Linger();
    });
  }

  void ArmTicker() {
    ticker_.expires_after(absl::ToChronoNanoseconds(tick_interval_));
    ticker_.async_wait([self = Self(), serial = serial_](beast::error_code ec) {
      if (ec || self->closed_ || serial != self->serial_ || !self->tick_fn_) return;
      self->tick_fn_();
      if (self->tick_fn_ && !self->closed_) self->ArmTicker();
    });
  }

  HttpConnectionHost* host_;
  const HttpTransportOptions& options_;
  Strand strand_;
  std::string client_;
  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  Clock::time_point header_deadline_;
  Clock::time_point body_deadline_base_;
  Clock::time_point linger_deadline_;
  int served_ = 0;
  uint64_t serial_ = 0;  // of the request being answered
  bool keep_alive_ = true;
  bool chunked_ = true;  // the client speaks HTTP/1.1
  bool linger_ = false;
  bool started_ = false;  // the status line is queued
  bool done_ = false;     // the whole response is queued
  bool closed_ = false;
  bool writing_ = false;
  std::deque<std::string> out_;
  std::string sending_;
  size_t queued_bytes_ = 0;  // queued and not yet taken by the socket
  std::function<void()> on_close_;
  // Holds the connection while a handler answers (no socket operation holds it then).
  std::shared_ptr<HttpConnectionBase> answering_;
  net::steady_timer ticker_;
  absl::Duration tick_interval_;
  std::function<void()> tick_fn_;
};

}  // namespace tandem
