// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/httplib/server.h"

#include "httplib/fiber.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <utility>
#include <vector>

namespace idem::httplib {
namespace {

constexpr size_t kReadBuffer = size_t{16} * 1024;
// How often a connection waiting for its next request looks at stop().
constexpr int64_t kIdleSliceMs = 100;
// Longer timeouts are taken as "a very long time" (no overflow).
constexpr int64_t kMaxTimeoutMs = int64_t{INT_MAX};

// The address getpeername or getsockname gives for `sock`, as cpp-httplib
// reports it (numeric host, port); left unchanged on an error.
void AddressOf(int (*get)(int, sockaddr*, socklen_t*), socket_t sock, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (get(sock, reinterpret_cast<sockaddr*>(&a), &len) != 0) return;
  char host[NI_MAXHOST] = {};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0)
    return;
  ip = host;
  if (a.ss_family == AF_INET) port = ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
  if (a.ss_family == AF_INET6) port = ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
}

char AsciiLower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

// The value of header `name` (lower case, with its colon) in a request head
// (lower-cased), or empty.
std::string HeaderIn(const std::string& head, const char* name) {
  const std::string key = std::string("\r\n") + name;
  const size_t at = head.find(key);
  if (at == std::string::npos) return {};
  const size_t from = at + key.size(), to = head.find("\r\n", from);
  std::string v = head.substr(from, to == std::string::npos ? std::string::npos : to - from);
  v.erase(0, v.find_first_not_of(" \t"));
  return v;
}

// One connection's stream, for all of its requests. Reads are buffered (a
// pipelined request read with the one before it waits in the buffer). A
// response's head is held back and goes out with the first piece of its body
// in one writev (one TCP segment for the usual small response); later pieces
// (a streamed body) go out as written.
class ConnectionStream final : public ::httplib::Stream {
 public:
  ConnectionStream(socket_t sock, int read_timeout_ms, int write_timeout_ms)
      : sock_(sock),
        fiber_(internal::CurrentFiber() != nullptr),
        read_timeout_ms_(read_timeout_ms),
        write_timeout_ms_(write_timeout_ms),
        in_(kReadBuffer) {
    // cpp-httplib asks for them with every request; they do not change.
    AddressOf(::getpeername, sock_, remote_.ip, remote_.port);
    AddressOf(::getsockname, sock_, local_.ip, local_.port);
  }

  bool is_readable() const override { return off_ < len_ || WaitIn(read_timeout_ms_) > 0; }
  // As cpp-httplib's own: false once a send failed or the peer is gone (a
  // content provider looping on DataSink::is_writable() stops).
  bool is_writable() const override {
    if (failed_) return false;
    pollfd p{sock_, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) return true;  // nothing to read: alive
    if ((p.revents & (POLLERR | POLLNVAL)) != 0) return false;
    char byte;
    return ::recv(sock_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0;  // 0: the peer closed
  }

  ssize_t read(char* ptr, size_t size) override {
    // What the peer may be waiting for before it sends more (100 Continue).
    if (!out_.empty() && !Send(nullptr, 0)) return -1;
    if (off_ == len_) {
      ssize_t n;
      for (;;) {
        // On a thread SO_RCVTIMEO (the read timeout) bounds it; a fiber
        // waits for the bytes with the same timeout.
        n = ::recv(sock_, in_.data(), in_.size(), fiber_ ? MSG_DONTWAIT : 0);
        if (n >= 0) break;
        if (errno == EINTR) continue;
        if (!fiber_ || (errno != EAGAIN && errno != EWOULDBLOCK) ||
            internal::WaitForSocket(/*write=*/false, read_timeout_ms_) <= 0)
          break;
      }
      if (n <= 0) return n < 0 ? -1 : 0;
      off_ = 0;
      len_ = static_cast<size_t>(n);
    }
    const size_t k = std::min(size, len_ - off_);
    std::memcpy(ptr, in_.data() + off_, k);
    off_ += k;
    Consumed(ptr, k);
    return static_cast<ssize_t>(k);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (failed_) return -1;
    if (head_expected_ && size >= 12 && std::memcmp(ptr, "HTTP/1.", 7) == 0) {
      // A response head (cpp-httplib writes the status line and headers in
      // one write): held back for its body. An interim one (100 Continue)
      // goes before the next read; a final one's status is noted.
      int status = 0;
      std::from_chars(ptr + 9, ptr + 12, status);
      if (status >= 200) {
        status_ = status;
        head_expected_ = false;
      }
      out_.append(ptr, size);
      return static_cast<ssize_t>(size);
    }
    return Send(ptr, size) ? static_cast<ssize_t>(size) : -1;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = remote_.ip;
    port = remote_.port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = local_.ip;
    port = local_.port;
  }
  socket_t socket() const override { return sock_; }

  // Sends what is held back (a head without a body, a 100 Continue).
  bool Flush() { return out_.empty() ? !failed_ : Send(nullptr, 0); }

  // Before each request: its response's head is the next thing written.
  void NextResponse() {
    head_expected_ = true;
    status_ = 0;
    head_.clear();
    head_done_ = chunked_ = false;
    body_read_ = content_length_ = 0;
  }
  // Whether the bytes after this request can be trusted to start the next
  // one: its head and its whole body were read. Not so when cpp-httplib
  // answered before reading them (a request line it cannot parse, a body too
  // long, an expectation it refuses: a 400, 413 or 417), or a handler left
  // its body unread; reading on would take the rest (a body, say) for
  // requests of their own. A chunked body that ended in an error is not
  // trusted either (where it ends is unknown).
  bool AtRequestBoundary() const {
    if (!head_done_) return false;
    if (chunked_) return status_ < 400;
    return body_read_ >= content_length_;
  }

  // Waits until the next request can be read: false on stop() (`listening`
  // closed), after `keep_alive_ms` idle, or on a socket error.
  bool WaitForRequest(const std::atomic<socket_t>& listening, int64_t keep_alive_ms) const {
    if (listening == INVALID_SOCKET) return false;
    if (off_ < len_) return true;  // pipelined: already here
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const int64_t waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
      const int64_t left = keep_alive_ms - waited;
      const int r = WaitIn(static_cast<int>(std::clamp<int64_t>(left, 0, kIdleSliceMs)));
      if (r != 0) return r > 0;  // readable, closed by the peer (recv says so) or an error
      if (left <= 0 || listening == INVALID_SOCKET) return false;
    }
  }

 private:
  // Sends the held-back bytes and then [ptr, ptr + size), together (writev),
  // until all of it is taken or the socket fails.
  bool Send(const char* ptr, size_t size) {
    size_t held_sent = 0, sent = 0;
    while (held_sent < out_.size() || sent < size) {
      iovec v[2];
      int n = 0;
      if (held_sent < out_.size()) v[n++] = {out_.data() + held_sent, out_.size() - held_sent};
      if (sent < size) v[n++] = {const_cast<char*>(ptr) + sent, size - sent};
      msghdr m{};
      m.msg_iov = v;
      m.msg_iovlen = static_cast<size_t>(n);
      // On a thread SO_SNDTIMEO (the write timeout) bounds it; a fiber waits
      // for room with the same timeout.
      const ssize_t w = ::sendmsg(sock_, &m, MSG_NOSIGNAL | (fiber_ ? MSG_DONTWAIT : 0));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && fiber_ && (errno == EAGAIN || errno == EWOULDBLOCK) &&
          internal::WaitForSocket(/*write=*/true, write_timeout_ms_) > 0)
        continue;
      if (w <= 0) {
        failed_ = true;
        out_.clear();
        return false;
      }
      size_t k = static_cast<size_t>(w);
      const size_t from_held = std::min(k, out_.size() - held_sent);
      held_sent += from_held;
      sent += k - from_held;
    }
    out_.clear();
    return true;
  }

  // Follows the request through the bytes cpp-httplib read: its head (to
  // the empty line), then its body. (cpp-httplib reads a head one byte at a
  // time: this is called per byte until the empty line.)
  void Consumed(const char* p, size_t k) {
    if (head_done_) {
      body_read_ += k;
      return;
    }
    for (size_t i = 0; i < k; ++i) {
      if (head_.size() < kMaxHead) head_.push_back(AsciiLower(p[i]));
      const size_t n = head_.size();
      if (n >= 4 && head_.compare(n - 4, 4, "\r\n\r\n") == 0) {
        head_done_ = true;
        chunked_ = HeaderIn(head_, "transfer-encoding:").find("chunked") != std::string::npos;
        content_length_ = std::strtoull(HeaderIn(head_, "content-length:").c_str(), nullptr, 10);
        body_read_ = k - i - 1;
        return;
      }
    }
  }

  // Waits until the socket is readable: > 0 readable (or closed, or an
  // error: recv says which), 0 timed out.
  int WaitIn(int timeout_ms) const {
    if (fiber_) return internal::WaitForSocket(/*write=*/false, timeout_ms);
    pollfd p{sock_, POLLIN, 0};
    int r;
    do {
      r = ::poll(&p, 1, timeout_ms);
    } while (r < 0 && errno == EINTR);
    return r;
  }

  struct Address {
    std::string ip;
    int port = 0;
  };
  socket_t sock_;
  bool fiber_;  // run by a Server's fiber (set_fibers): waits give the thread up
  int read_timeout_ms_, write_timeout_ms_;
  Address remote_, local_;  // looked up once, at the start
  std::vector<char> in_;
  size_t off_ = 0, len_ = 0;
  std::string out_;  // a response head held back for its body
  bool head_expected_ = true;
  int status_ = 0;
  // The request being read: its head so far (lower case), then its body.
  static constexpr size_t kMaxHead = size_t{64} * 1024;
  std::string head_;
  bool head_done_ = false, chunked_ = false;
  uint64_t body_read_ = 0, content_length_ = 0;
  bool failed_ = false;
};

// Shuts the connection down and closes it however the loop ends.
struct SocketCloser {
  socket_t sock;
  ~SocketCloser() {
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
  }
};

int64_t Millis(time_t sec, time_t usec) {
  if (sec >= kMaxTimeoutMs / 1000) return kMaxTimeoutMs;
  return std::min<int64_t>(kMaxTimeoutMs, static_cast<int64_t>(sec) * 1000 + static_cast<int64_t>(usec) / 1000);
}

}  // namespace

// cpp-httplib's server with idem's connection loop: it overrides
// httplib::Server's per-connection loop (a virtual, as cpp-httplib's own
// SSLServer does); requests still go through its process_request.
class Server::Impl final : public ::httplib::Server {
 public:
  Status SetFibers(int threads) {
    if (threads < 0)
      return Status::InvalidArgument("Server::set_fibers: threads cannot be negative, got " + std::to_string(threads));
    if (threads == 0) {
      loops_.reset();
      return Status::OK();
    }
    try {  // the fibers' epoll sets
      loops_ = std::make_unique<internal::Loops>(threads);
    } catch (const std::exception& e) {
      return Status::Unavailable(e.what());
    }
    return Status::OK();
  }

 private:
  bool process_and_close_socket(socket_t sock) override {
    SocketCloser closer{sock};
    if (loops_ == nullptr) return Serve(sock);
    bool ret = false;
    loops_->Run(sock, [&] { ret = Serve(sock); });
    return ret;
  }

  bool Serve(socket_t sock) {
    ConnectionStream strm(sock, static_cast<int>(Millis(read_timeout_sec_, read_timeout_usec_)),
                          static_cast<int>(Millis(write_timeout_sec_, write_timeout_usec_)));
    const int64_t keep_alive_ms = Millis(keep_alive_timeout_sec_, 0);
    bool ret = false;
    for (size_t count = keep_alive_max_count_; count > 0 && strm.WaitForRequest(svr_sock_, keep_alive_ms); --count) {
      bool connection_closed = false;
      strm.NextResponse();
      ret = process_request(strm, /*close_connection=*/count == 1, connection_closed, nullptr);
      if (!strm.Flush()) ret = false;
      if (!ret || connection_closed || !strm.AtRequestBoundary()) break;
    }
    return ret;
  }

  std::unique_ptr<internal::Loops> loops_;
};

Server::Server() : impl_(std::make_unique<Impl>()) {}
Server::~Server() = default;

::httplib::Server& Server::native() { return *impl_; }

Status Server::set_fibers(int threads) { return impl_->SetFibers(threads); }

}  // namespace idem::httplib
