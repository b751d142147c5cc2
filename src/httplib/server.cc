// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/httplib/server.h"

#include "core/signal_stop.h"
#include "http/pool.h"
#include "httplib/client_address.h"
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
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace idem::httplib {
namespace {

constexpr size_t kReadBuffer = size_t{16} * 1024;
// How much of a request a connection reads while it waits for it (head and
// body) before a handler's thread takes it; the rest of a longer one is read
// by cpp-httplib, within the same deadline.
constexpr size_t kPrefetchMax = size_t{256} * 1024;
// How often a connection waiting for its next request looks at stop().
constexpr int64_t kIdleSliceMs = 100;
// Longer timeouts are taken as "a very long time" (no overflow).
constexpr int64_t kMaxTimeoutMs = int64_t{INT_MAX};

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool OnFiber() { return internal::CurrentFiber() != nullptr; }

// The accept thread, inside AcceptQueue::enqueue: a connection handed over
// from there is the server's to keep (nothing waits for it there).
thread_local bool tl_accepting = false;

// The peer's (or our own) address, as cpp-httplib reports it.
struct Address {
  std::string ip;
  int port = 0;
};

// The address getpeername or getsockname gives for `sock`, as cpp-httplib
// reports it (numeric host, port); left unchanged on an error.
void AddressOf(int (*get)(int, sockaddr*, socklen_t*), socket_t sock, Address& out) {
  (void)http_internal::SocketAddress(get, sock, out.ip, out.port);
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

// What a connection's wait for a whole request came to.
enum class Arrival { kReady, kDeadline, kClosed, kStopped };

// One connection's stream, for all of its requests. Reads are buffered (a
// pipelined request read with the one before it waits in the buffer). A
// response's head is held back and goes out with the first piece of its body
// in one writev (one TCP segment for the usual small response); later pieces
// (a streamed body) go out as written. Its socket stays blocking for its
// life; every recv and send is MSG_DONTWAIT and waits (a fiber parked on the
// socket, a thread in poll) only on EAGAIN, so the same stream serves on a
// fiber and on a thread.
class ConnectionStream final : public ::httplib::Stream {
 public:
  ConnectionStream(socket_t sock, Address remote, int read_timeout_ms, int write_timeout_ms, uint64_t body_max)
      : sock_(sock),
        read_timeout_ms_(read_timeout_ms),
        write_timeout_ms_(write_timeout_ms),
        body_max_(body_max),
        remote_(std::move(remote)),
        in_(kReadBuffer) {
    // cpp-httplib asks for it with every request; it does not change.
    AddressOf(::getsockname, sock_, local_);
  }

  bool is_readable() const override { return off_ < len_ || WaitIn(ReadWaitMs()) > 0; }
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
      // The read timeout, and the request's deadline, bound the wait.
      const Got got = Fill(ReadWaitMs());
      if (got != Got::kBytes) {
        if (NowMs() >= deadline_ms_) deadline_missed_ = true;
        return got == Got::kEnd ? 0 : -1;
      }
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

  // The request about to be read must have arrived whole by `deadline_ms`
  // (steady clock).
  void StartRequest(int64_t deadline_ms) {
    deadline_ms_ = deadline_ms;
    deadline_missed_ = false;
  }
  // Whether a read of this request failed because its deadline passed.
  bool deadline_missed() const { return deadline_missed_; }

  // Reads until the buffer holds the whole request (its head and a body of
  // up to kPrefetchMax; only the head of a chunked request or of one that
  // waits for 100 Continue), or with `head_only` its head, waiting as the
  // stream's other waits do. kDeadline past the request's deadline, kStopped
  // on stop() (`listening` closed), kClosed when the peer closed or the
  // socket failed.
  Arrival Prefetch(const std::atomic<socket_t>& listening, bool head_only = false) {
    return ReadUntil(listening, [&] { return head_only ? !BufferedHead().empty() || Full() : RequestBuffered(); });
  }
  // Reads until `ready()` (it looks at Buffered()), as Prefetch waits.
  template <class Ready>
  Arrival ReadUntil(const std::atomic<socket_t>& listening, Ready ready) {
    for (;;) {
      if (ready()) return Arrival::kReady;
      if (listening == INVALID_SOCKET) return Arrival::kStopped;
      const int64_t left = deadline_ms_ - NowMs();
      if (left <= 0) return Arrival::kDeadline;
      const Got got = Fill(std::min(left, kIdleSliceMs));
      if (got == Got::kEnd || got == Got::kError) return Arrival::kClosed;
    }
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

  // The bytes read and not yet taken.
  std::string_view Buffered() const { return {in_.data() + off_, len_ - off_}; }
  // The buffered request head, to its empty line; empty until it is all here.
  std::string_view BufferedHead() const {
    const std::string_view buf = Buffered();
    const size_t end = buf.find("\r\n\r\n");
    return end == std::string_view::npos ? std::string_view() : buf.substr(0, end + 4);
  }
  // Takes `n` buffered bytes that are no request's (a PROXY header).
  void Skip(size_t n) { off_ += std::min(n, len_ - off_); }
  // The client's address, as a PROXY header gave it.
  void set_remote(Address remote) { remote_ = std::move(remote); }

  // Sends what is held back (a head without a body, a 100 Continue).
  bool Flush() { return out_.empty() ? !failed_ : Send(nullptr, 0); }
  // Forgets a held head whose body could not be written: the client gets
  // nothing rather than a head without its body.
  void Discard() { out_.clear(); }

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
  bool WaitForRequest(const std::atomic<socket_t>& listening, int64_t keep_alive_ms) {
    if (listening == INVALID_SOCKET) return false;
    if (off_ < len_) return true;  // pipelined: already here
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      const int64_t waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
      const int64_t left = keep_alive_ms - waited;
      const Got got = Fill(std::clamp<int64_t>(left, 0, kIdleSliceMs));
      if (got == Got::kBytes) return true;
      if (got != Got::kTimeout || left <= 0 || listening == INVALID_SOCKET) return false;
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
      // The write timeout bounds the wait for room.
      const ssize_t w = ::sendmsg(sock_, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && Wait(/*write=*/true, write_timeout_ms_) > 0) continue;
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

  enum class Got { kBytes, kEnd, kError, kTimeout };

  // One recv into the buffer's free end (made room for first), waiting at
  // most `wait_ms` for bytes.
  Got Fill(int64_t wait_ms) {
    if (off_ == len_) off_ = len_ = 0;
    if (len_ == in_.size()) {
      if (off_ > 0) {
        std::memmove(in_.data(), in_.data() + off_, len_ - off_);
        len_ -= off_;
        off_ = 0;
      } else {
        in_.resize(std::min(kPrefetchMax, 2 * in_.size()));
      }
    }
    bool waited = false;
    for (;;) {
      const ssize_t n = ::recv(sock_, in_.data() + len_, in_.size() - len_, MSG_DONTWAIT);
      if (n > 0) {
        len_ += static_cast<size_t>(n);
        return Got::kBytes;
      }
      if (n == 0) return Got::kEnd;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return Got::kError;
      if (waited || WaitIn(wait_ms) <= 0) return Got::kTimeout;
      waited = true;
    }
  }

  // Whether the buffer holds as much as it waits for.
  bool Full() const { return len_ - off_ >= kPrefetchMax; }

  // Whether the buffer holds a whole request (as Prefetch says).
  bool RequestBuffered() const {
    const size_t have = len_ - off_;
    if (Full()) return true;
    const std::string_view buf(in_.data() + off_, have);
    const size_t end = buf.find("\r\n\r\n");
    if (end == std::string_view::npos) return false;
    const size_t head_len = end + 4;
    std::string head(buf.substr(0, head_len));
    for (char& c : head) c = AsciiLower(c);
    // The client waits for 100 Continue (or for a refusal) before its body;
    // where a chunked body ends is cpp-httplib's to find.
    if (!HeaderIn(head, "expect:").empty()) return true;
    if (HeaderIn(head, "transfer-encoding:").find("chunked") != std::string::npos) return true;
    const uint64_t length = std::strtoull(HeaderIn(head, "content-length:").c_str(), nullptr, 10);
    // A body over the limit is refused from its head (413), unread.
    return length > body_max_ || head_len + length >= kPrefetchMax || have - head_len >= length;
  }

  // How long a read may wait: the read timeout, within the request's deadline.
  int ReadWaitMs() const { return static_cast<int>(std::clamp<int64_t>(deadline_ms_ - NowMs(), 0, read_timeout_ms_)); }

  // Waits until the socket is readable (or writable): > 0 ready (or closed,
  // or an error: recv/send says which), 0 timed out. A fiber gives its
  // thread up; a thread polls.
  int Wait(bool write, int64_t timeout_ms) const {
    if (OnFiber()) return internal::WaitForSocket(write, timeout_ms);
    pollfd p{sock_, static_cast<short>(write ? POLLOUT : POLLIN), 0};
    int r;
    do {
      r = ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(timeout_ms, 0, kMaxTimeoutMs)));
    } while (r < 0 && errno == EINTR);
    return r;
  }
  int WaitIn(int64_t timeout_ms) const { return Wait(/*write=*/false, timeout_ms); }

  socket_t sock_;
  int read_timeout_ms_, write_timeout_ms_;
  uint64_t body_max_;       // cpp-httplib's payload_max_length
  Address remote_, local_;  // looked up once, at the start
  int64_t deadline_ms_ = INT64_MAX;
  bool deadline_missed_ = false;
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

int64_t Millis(time_t sec, time_t usec) {
  if (sec >= kMaxTimeoutMs / 1000) return kMaxTimeoutMs;
  return std::min<int64_t>(kMaxTimeoutMs, static_cast<int64_t>(sec) * 1000 + static_cast<int64_t>(usec) / 1000);
}

// A connection (or a trusted proxy's request) over a bound: answered
// without waiting (the socket's buffer takes it), what already arrived is
// read away (so the close sends a FIN after the answer, not a reset before
// it); the caller closes it.
void SendRefusal(socket_t sock) {
  static constexpr std::string_view k503 =
      "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  (void)!::send(sock, k503.data(), k503.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(sock, SHUT_WR);
  char scratch[4096];
  for (int i = 0; i < 16 && ::recv(sock, scratch, sizeof scratch, MSG_DONTWAIT) > 0; ++i) {
  }
}
void Refuse(socket_t sock) {
  SendRefusal(sock);
  ::close(sock);
}

// Signalled once: a thread of a task queue set on native() waits on it for
// its connection's end.
class Ended {
 public:
  void Set() {
    std::lock_guard lock(mu_);
    set_ = true;
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return set_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool set_ = false;
};

}  // namespace

// cpp-httplib's server with idem's connection loop: it overrides
// httplib::Server's per-connection loop (a virtual, as cpp-httplib's own
// SSLServer does); requests still go through its process_request. Its task
// queue (new_task_queue) is the accept thread itself: a connection is
// admitted there and handed to a fiber, and listen() returns after every
// connection has ended (AcceptQueue::shutdown).
class Server::Impl final : public ::httplib::Server {
 public:
  explicit Impl(const ::idem::httplib::Server::Options& options) : options_(options) {
    set_keep_alive_max_count(static_cast<size_t>(options_.keep_alive_requests));
    new_task_queue = [this] { return new AcceptQueue(*this); };
    std::string bad;  // Open checked them
    trusted_ = internal::TrustedProxies::Parse(options_.trusted_proxies, bad).value_or(internal::TrustedProxies());
  }
  ~Impl() override {
    loops_.reset();  // its fibers have ended: none waits for a worker
    if (workers_ != nullptr) workers_->shutdown();
  }
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // Makes the loops (and threads) Options ask for unless made; kUnavailable
  // when they cannot be.
  Status Start() {
    std::lock_guard lock(start_mu_);
    if (loops_ != nullptr) return Status::OK();
    try {
      if (options_.fibers > 0) {
        loops_ = std::make_unique<internal::Loops>(options_.fibers);
      } else {
        // One loop waits for every connection's bytes; the threads run requests.
        loops_ = std::make_unique<internal::Loops>(1);
        if (workers_ == nullptr) workers_ = std::make_unique<::httplib::ThreadPool>(options_.threads);
      }
    } catch (const std::exception& e) {
      return Status::Unavailable(std::string("idem::httplib::Server: ") + e.what());
    }
    return Status::OK();
  }

  Status SetFibers(int threads) {
    if (threads < 0 || threads > 1024)
      return Status::InvalidArgument("Server::set_fibers: threads must be 0..1024, got " + std::to_string(threads));
    {
      std::lock_guard lock(start_mu_);
      options_.fibers = threads;
      loops_.reset();
    }
    return Start();
  }

  ::idem::httplib::Server::Counters counters() const {
    std::lock_guard lock(mu_);
    return {.accepted = accepted_,
            .refused = refused_,
            .deadline_closes = deadline_closes_,
            .open = open_,
            .proxy_refused = proxy_refused_,
            .forwarded_for_malformed = forwarded_for_malformed_};
  }

  // What ::httplib::Server::stop() does (the listening socket closed: the
  // accept loop ends, and every connection at its next wait), without its
  // assert, which a second call before listen() returns would fail: so a
  // signal handler may call it, as often as signals come.
  void StopListening() noexcept {
    const socket_t s = svr_sock_.exchange(INVALID_SOCKET);
    if (s == INVALID_SOCKET) return;
    ::shutdown(s, SHUT_RDWR);
    ::close(s);
  }

 private:
  // The accept thread as cpp-httplib's task queue: enqueue runs the task (a
  // call of process_and_close_socket) at once.
  class AcceptQueue final : public ::httplib::TaskQueue {
   public:
    explicit AcceptQueue(Impl& impl) : impl_(impl) {}
    void enqueue(std::function<void()> fn) override {
      tl_accepting = true;
      fn();
      tl_accepting = false;
    }
    void shutdown() override { impl_.WaitAllEnded(); }

   private:
    Impl& impl_;
  };

  // An admitted connection, owned by its fiber's body: closing it (after
  // the fiber left the epoll set) gives its place back.
  struct Connection {
    Impl& impl;
    socket_t sock;
    Address peer;
    // The client it is counted for under max_connections_per_client (the
    // peer's address, canonical); empty for a trusted proxy's connection
    // (until a PROXY header names its client).
    std::string client;
    std::shared_ptr<Ended> ended;  // set: a thread waits for the end
    ~Connection() {
      ::shutdown(sock, SHUT_RDWR);
      ::close(sock);
      impl.Release(client);
      if (ended) ended->Set();
    }
  };

  // A trusted proxy's request counted for its client until it ends.
  struct RequestCount {
    Impl* impl = nullptr;
    std::string client;
    RequestCount() = default;
    RequestCount(const RequestCount&) = delete;
    RequestCount& operator=(const RequestCount&) = delete;
    ~RequestCount() {
      if (impl != nullptr) impl->ReleaseClient(client);
    }
  };

  bool process_and_close_socket(socket_t sock) override {
    Address peer;
    AddressOf(::getpeername, sock, peer);
    const std::string client = trusted_.Contains(peer.ip) ? std::string() : internal::CanonicalIp(peer.ip);
    if (!Start().ok() || !Admit(client)) {
      Refuse(sock);
      return false;
    }
    std::shared_ptr<Connection> conn(new Connection{*this, sock, std::move(peer), client, nullptr});
    // A thread of a task queue set on native(): it holds the connection
    // until the end, as cpp-httplib's own loop would.
    std::shared_ptr<Ended> ended;
    if (!tl_accepting) conn->ended = ended = std::make_shared<Ended>();
    loops_->Spawn(sock, [this, conn] { Serve(*conn); });
    conn.reset();
    if (ended) ended->Wait();
    return true;
  }

  // A connection, counted for `client` (none: empty) unless over a bound.
  bool Admit(const std::string& client) {
    std::lock_guard lock(mu_);
    if (open_ >= options_.max_connections || !CountClient(client)) {
      ++refused_;
      return false;
    }
    ++open_;
    ++accepted_;
    return true;
  }
  // A client named by a trusted proxy (a PROXY header, X-Forwarded-For),
  // counted unless over its bound.
  bool AdmitClient(const std::string& client) {
    std::lock_guard lock(mu_);
    if (CountClient(client)) return true;
    ++refused_;
    return false;
  }
  // Under mu_: one more for `client` (empty: none), unless at its bound.
  bool CountClient(const std::string& client) {
    if (client.empty()) return true;
    int& from = per_client_[client];
    if (options_.max_connections_per_client > 0 && from >= options_.max_connections_per_client) {
      if (from == 0) per_client_.erase(client);
      return false;
    }
    ++from;
    return true;
  }
  void ReleaseClient(const std::string& client) {
    if (client.empty()) return;
    std::lock_guard lock(mu_);
    if (auto it = per_client_.find(client); it != per_client_.end() && --it->second <= 0) per_client_.erase(it);
  }
  void Release(const std::string& client) {
    ReleaseClient(client);
    std::lock_guard lock(mu_);
    if (--open_ == 0) ended_cv_.notify_all();
  }
  void WaitAllEnded() {
    std::unique_lock lock(mu_);
    ended_cv_.wait(lock, [&] { return open_ == 0; });
  }
  void CountDeadlineClose() {
    std::lock_guard lock(mu_);
    ++deadline_closes_;
  }
  void Log(const std::string& line) {
    if (options_.log) options_.log(line);
  }

  // A connection refused for its PROXY header: closed unanswered.
  void RefuseProxyHeader(const Connection& conn, const std::string& why) {
    {
      std::lock_guard lock(mu_);
      ++proxy_refused_;
    }
    Log("connection from " + conn.peer.ip + " closed: " + why);
  }

  // With Options::proxy_protocol, at the start of a trusted proxy's
  // connection: its PROXY header read and taken (the client it names
  // counted for the connection, and made its remote address). False when
  // the connection ends here. `by_request`: its requests are counted each
  // for its own client; `fallback`: for whom without one.
  bool TakeProxyHeader(Connection& conn, ConnectionStream& strm, bool& by_request, std::string& fallback) {
    strm.StartRequest(NowMs() + options_.request_deadline_ms);
    internal::ProxyHeader header;
    internal::ProxyParse parsed = internal::ProxyParse::kNeedMore;
    std::string why;
    const Arrival arrival = strm.ReadUntil(svr_sock_, [&] {
      parsed = internal::ParseProxyHeader(strm.Buffered(), header, why);
      return parsed != internal::ProxyParse::kNeedMore;
    });
    if (arrival == Arrival::kDeadline)
      RefuseProxyHeader(conn, "no whole PROXY header from a trusted proxy within the request deadline");
    if (arrival != Arrival::kReady) return false;
    if (parsed == internal::ProxyParse::kMalformed) {
      RefuseProxyHeader(conn, "a malformed PROXY header from a trusted proxy: " + why);
      return false;
    }
    strm.Skip(header.length);
    if (!header.source) return true;  // the proxy's own connection
    Address source{internal::CanonicalIp(*header.source), header.source_port};
    strm.set_remote(source);
    fallback = source.ip;
    if (trusted_.Contains(*header.source)) return true;  // a proxy: its requests name their clients
    if (!AdmitClient(source.ip)) {
      SendRefusal(conn.sock);
      return false;
    }
    conn.client = source.ip;
    by_request = false;
    return true;
  }

  // The client a trusted proxy's request (its head) is counted for.
  std::string RequestClient(std::string_view head, const std::string& fallback, const Connection& conn) {
    internal::IpAddress client;
    std::string bad;
    switch (internal::ClientInForwardedFor(internal::ForwardedForIn(head), trusted_, client, bad)) {
      case internal::ForwardedFor::kClient: return internal::CanonicalIp(client);
      case internal::ForwardedFor::kAbsent: return fallback;
      case internal::ForwardedFor::kMalformed: break;
    }
    {
      std::lock_guard lock(mu_);
      ++forwarded_for_malformed_;
    }
    Log("X-Forwarded-For from trusted proxy " + conn.peer.ip + ": " + internal::QuotedForLog(bad) +
        " is not an address; the request counts for " + fallback);
    return fallback;
  }

  // The connection loop, on a fiber: it waits (parked) for each request's
  // bytes, then serves the request there (fibers) or on a worker thread.
  void Serve(Connection& conn) {
    ConnectionStream strm(conn.sock, conn.peer, static_cast<int>(Millis(read_timeout_sec_, read_timeout_usec_)),
                          static_cast<int>(Millis(write_timeout_sec_, write_timeout_usec_)), payload_max_length_);
    // A trusted proxy's connection: each request counted for its client.
    bool by_request = conn.client.empty();
    std::string fallback = internal::CanonicalIp(conn.peer.ip);
    // A peer not trusted must not start with a PROXY header (looked at
    // once its first request has arrived).
    bool refuse_proxy_header = options_.proxy_protocol && !by_request;
    if (options_.proxy_protocol && by_request && !TakeProxyHeader(conn, strm, by_request, fallback)) return;
    by_request = by_request && options_.max_connections_per_client > 0;
    const int64_t keep_alive_ms = Millis(keep_alive_timeout_sec_, 0);
    for (size_t count = keep_alive_max_count_; count > 0 && strm.WaitForRequest(svr_sock_, keep_alive_ms); --count) {
      strm.StartRequest(NowMs() + options_.request_deadline_ms);
      Arrival arrival = strm.Prefetch(svr_sock_, /*head_only=*/by_request);
      if (refuse_proxy_header && internal::LooksLikeProxyHeader(strm.Buffered())) {
        RefuseProxyHeader(conn, "a PROXY header from an address that is not a trusted proxy");
        return;
      }
      refuse_proxy_header = false;
      RequestCount counted;
      if (arrival == Arrival::kReady && by_request) {
        std::string client = RequestClient(strm.BufferedHead(), fallback, conn);
        if (!AdmitClient(client)) {
          SendRefusal(conn.sock);
          return;
        }
        counted.impl = this;
        counted.client = std::move(client);
        arrival = strm.Prefetch(svr_sock_);
      }
      if (arrival == Arrival::kDeadline) CountDeadlineClose();
      if (arrival != Arrival::kReady) return;
      bool again = false;
      OnWorker([&] { again = ServeRequest(strm, /*last=*/count == 1); });
      if (!again) return;
    }
  }

  // One request, whose bytes have arrived: whether the connection goes on.
  bool ServeRequest(ConnectionStream& strm, bool last) {
    bool connection_closed = false;
    strm.NextResponse();
    bool ok = process_request(strm, last, connection_closed, nullptr);
    // Not ok: nothing was written, or a body failed (a content provider
    // that returned false, a send that failed) after its head was held.
    if (!ok)
      strm.Discard();
    else if (!strm.Flush())
      ok = false;
    if (strm.deadline_missed()) {
      CountDeadlineClose();
      return false;
    }
    return ok && !connection_closed && strm.AtRequestBoundary();
  }

  // Runs `fn` on a worker thread while this fiber is parked (no fibers of
  // Options'), else here.
  void OnWorker(const std::function<void()>& fn) {
    internal::Fiber* self = internal::CurrentFiber();
    if (workers_ == nullptr || self == nullptr) {
      fn();
      return;
    }
    workers_->enqueue([&fn, self] {
      try {
        fn();
      } catch (...) {  // the connection ends (fn's result stays "no")
      }
      internal::Wake(self);  // the last touch: the fiber may return at once
    });
    internal::ParkUntilWoken();
  }

  ::idem::httplib::Server::Options options_;
  std::mutex start_mu_;  // loops_ and workers_ are made once, by the first that needs them
  std::unique_ptr<internal::Loops> loops_;
  std::unique_ptr<::httplib::ThreadPool> workers_;
  mutable std::mutex mu_;
  std::condition_variable ended_cv_;
  std::unordered_map<std::string, int> per_client_;
  int64_t open_ = 0, accepted_ = 0, refused_ = 0, deadline_closes_ = 0, proxy_refused_ = 0,
          forwarded_for_malformed_ = 0;
  internal::TrustedProxies trusted_;
};

Status Server::Check(const Options& options) {
  auto bad = [](const std::string& field, int64_t v, const char* range) {
    return Status::InvalidArgument("idem::httplib::Server::Options::" + field + " must be " + range + ", got " +
                                   std::to_string(v));
  };
  if (options.request_deadline_ms < 1) return bad("request_deadline_ms", options.request_deadline_ms, ">= 1");
  if (options.max_connections < 1) return bad("max_connections", options.max_connections, ">= 1");
  if (options.max_connections_per_client < 0)
    return bad("max_connections_per_client", options.max_connections_per_client, ">= 0");
  if (options.threads < 1 || options.threads > 4096) return bad("threads", options.threads, "1..4096");
  if (options.fibers < 0 || options.fibers > 1024) return bad("fibers", options.fibers, "0..1024");
  if (options.keep_alive_requests < 1) return bad("keep_alive_requests", options.keep_alive_requests, ">= 1");
  std::string entry;
  if (!internal::TrustedProxies::Parse(options.trusted_proxies, entry))
    return Status::InvalidArgument("idem::httplib::Server::Options::trusted_proxies: '" + entry +
                                   "' is not an IP address or CIDR block (10.0.0.0/8, fd00::/8, 192.0.2.7)");
  if (options.proxy_protocol && options.trusted_proxies.empty())
    return Status::InvalidArgument(
        "idem::httplib::Server::Options::proxy_protocol needs trusted_proxies (the proxies that send it)");
  return Status::OK();
}

Result<std::unique_ptr<Server>> Server::Open(const Options& options) {
  IDEM_RETURN_IF_ERROR(Check(options));
  auto impl = std::make_unique<Impl>(options);
  IDEM_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

// The defaults are valid; the loops are made by the first connection (one
// that finds they cannot be is refused).
Server::Server() : impl_(std::make_unique<Impl>(Options{})) {}
Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
// A signal after this must not reach a destroyed server (StopOnSignals).
Server::~Server() { ::idem::internal::DetachFromSignals(this); }

void Server::Stop() noexcept { impl_->StopListening(); }

::httplib::Server& Server::native() { return *impl_; }

Status Server::set_fibers(int threads) { return impl_->SetFibers(threads); }

Server::Counters Server::counters() const { return impl_->counters(); }

}  // namespace idem::httplib

void idem::StopOnSignals(httplib::Server* server) { internal::StopOnSignalsOf(server); }
