// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "http/pool.h"

#include <netdb.h>
#include <netinet/in.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "idem/url.h"

namespace idem::http_internal {

std::string HexByte(unsigned char c) {
  constexpr char kDigits[] = "0123456789abcdef";
  return std::string("0x") + kDigits[c >> 4] + kDigits[c & 15];
}

// The first byte of `s` outside [lo, hi] (tab allowed when `tab`), or -1.
int FirstByteOutside(std::string_view s, unsigned char lo, unsigned char hi, bool tab) {
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if ((c < lo || c > hi) && !(tab && c == '\t')) return static_cast<int>(i);
  }
  return -1;
}

std::string BaseUrl::HostHeader() const {
  const bool default_port = (https && port == 443) || (!https && port == 80);
  return default_port ? host : host + ":" + std::to_string(port);
}

Status CheckHeaderValue(std::string_view name, std::string_view value) {
  if (int i = FirstByteOutside(value, 0x20, 0x7e, /*tab=*/true); i >= 0)
    return Status::InvalidArgument("header '" + std::string(name.substr(0, 64)) + "': its value holds byte " +
                                   HexByte(static_cast<unsigned char>(value[i])) +
                                   ", which a header value cannot carry (printable ASCII, spaces and tabs only)");
  return Status::OK();
}

Status CheckPath(std::string_view what, std::string_view path) {
  if (int i = FirstByteOutside(path, 0x21, 0x7e); i >= 0)
    return Status::InvalidArgument(std::string(what) + " holds byte " + HexByte(static_cast<unsigned char>(path[i])) +
                                   ", which a request line cannot carry (percent-encode it)");
  return Status::OK();
}

Result<BaseUrl> ParseBaseUrl(const std::string& text, std::string_view what_view) {
  const std::string what(what_view);
  const std::string scheme = UrlScheme(text);
  if (scheme != "http" && scheme != "https")
    return Status::InvalidArgument(what + " must start with http:// or https:// (got '" + RedactUrl(text) + "')");
  if (text.find_first_of("?#") != std::string::npos)
    return Status::InvalidArgument(what + " must have no query or fragment (got '" + RedactUrl(text) + "')");
  IDEM_ASSIGN_OR_RETURN(ParsedUrl u, ParseUrl(text, what));
  if (u.has_user) return Status::InvalidArgument(what + " must have no user info (got '" + RedactUrl(text) + "')");
  if (u.hosts.size() != 1) return Status::InvalidArgument(what + " must name one host (got '" + RedactUrl(text) + "')");
  BaseUrl out;
  out.https = scheme == "https";
  out.host = u.hosts[0].host;
  out.port = u.hosts[0].port != 0 ? u.hosts[0].port : (out.https ? 443 : 80);
  if (out.host.empty() || FirstByteOutside(out.host, 0x21, 0x7e) >= 0)
    return Status::InvalidArgument("bad host in " + what + " '" + RedactUrl(text) + "'");
  // The path as written (still %-encoded: it goes on the request line so).
  const size_t slash = text.find('/', scheme.size() + 3);
  std::string_view path = slash == std::string::npos ? std::string_view() : std::string_view(text).substr(slash);
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  IDEM_RETURN_IF_ERROR(CheckPath("the " + what + "'s path", path));
  out.path = std::string(path);
  return out;
}

bool FailedToConnect(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection:
    case httplib::Error::ConnectionTimeout:
    case httplib::Error::BindIPAddress:
    case httplib::Error::SSLConnection:
    case httplib::Error::SSLLoadingCerts:
    case httplib::Error::SSLServerVerification: return true;
    default: return false;
  }
}

bool Permanent(httplib::Error e) {
  return e == httplib::Error::SSLLoadingCerts || e == httplib::Error::SSLServerVerification;
}

namespace {

// A plain connection's socket as cpp-httplib's client writes and reads it.
// cpp-httplib 0.11's own stream polls before every read and every write,
// sends a request's head and body in two writes (two TCP segments with
// TCP_NODELAY: the server wakes twice) and reads a response's head a byte
// at a time. This one gathers what is written until the first read (one
// send for a request's head and body; a piece that would pass kWriteAhead
// goes out at once) and reads ahead into a buffer, polling only when the
// socket has nothing (the timeouts bound each wait, as cpp-httplib's do).
class BufferedStream final : public httplib::Stream {
 public:
  BufferedStream(socket_t sock, int64_t read_timeout_ms, int64_t write_timeout_ms)
      : sock_(sock), read_timeout_ms_(read_timeout_ms), write_timeout_ms_(write_timeout_ms) {}
  bool is_readable() const override { return off_ < len_ || (Flush() && Wait(POLLIN, read_timeout_ms_)); }
  bool is_writable() const override { return !failed_ && Wait(POLLOUT, write_timeout_ms_); }
  ssize_t read(char* ptr, size_t size) override {
    if (off_ == len_) {
      if (!Flush()) return -1;
      off_ = len_ = 0;
      for (;;) {
        const ssize_t n = ::recv(sock_, in_, sizeof in_, MSG_DONTWAIT);
        if (n >= 0) {
          len_ = static_cast<size_t>(n);
          break;
        }
        if (errno == EINTR) continue;
        if ((errno != EAGAIN && errno != EWOULDBLOCK) || !Wait(POLLIN, read_timeout_ms_)) return -1;
      }
      if (len_ == 0) return 0;
    }
    const size_t n = std::min(size, len_ - off_);
    std::memcpy(ptr, in_ + off_, n);
    off_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (failed_) return -1;
    if (out_.size() + size <= kWriteAhead) {
      out_.append(ptr, size);
      return static_cast<ssize_t>(size);
    }
    if (!Flush() || !SendAll(ptr, size)) return -1;
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    (void)SocketAddress(::getpeername, sock_, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    (void)SocketAddress(::getsockname, sock_, ip, port);
  }
  socket_t socket() const override { return sock_; }

  // Sends what is gathered; false once a send failed.
  bool Flush() const {
    if (failed_) return false;
    if (out_.empty()) return true;
    const bool sent = SendAll(out_.data(), out_.size());
    out_.clear();
    return sent;
  }

 private:
  static constexpr size_t kWriteAhead = size_t{64} * 1024;

  bool SendAll(const char* p, size_t size) const {
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::send(sock_, p + done, size - done, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && Wait(POLLOUT, write_timeout_ms_)) {
        continue;
      } else {
        failed_ = true;
        return false;
      }
    }
    return true;
  }
  bool Wait(short events, int64_t timeout_ms) const {
    pollfd p{sock_, events, 0};
    int r;
    do {
      r = ::poll(&p, 1, static_cast<int>(timeout_ms));
    } while (r < 0 && errno == EINTR);
    return r > 0;
  }
  const socket_t sock_;
  const int64_t read_timeout_ms_, write_timeout_ms_;
  mutable std::string out_;  // gathered, not sent yet
  mutable bool failed_ = false;
  char in_[16 * 1024];
  size_t off_ = 0, len_ = 0;
};

// A plain-HTTP connection whose requests go through BufferedStream.
class BufferedClient final : public httplib::ClientImpl {
 public:
  using httplib::ClientImpl::ClientImpl;

 protected:
  bool process_socket(const Socket& socket, std::function<bool(httplib::Stream& strm)> callback) override {
    BufferedStream strm(socket.sock, read_timeout_sec_ * 1000 + read_timeout_usec_ / 1000,
                        write_timeout_sec_ * 1000 + write_timeout_usec_ / 1000);
    const bool ok = callback(strm);
    return strm.Flush() && ok;
  }
};

}  // namespace

bool SocketAddress(int (*get)(int, sockaddr*, socklen_t*), int sock, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (get(sock, reinterpret_cast<sockaddr*>(&a), &len) != 0) return false;
  char host[NI_MAXHOST] = {};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) != 0)
    return false;
  ip = host;
  if (a.ss_family == AF_INET) port = ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
  if (a.ss_family == AF_INET6) port = ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
  return true;
}

ConnectionPool::ConnectionPool(BaseUrl url, PoolOptions options) : url_(std::move(url)), options_(std::move(options)) {}

ConnectionPool::Connection ConnectionPool::Open() const {
  Connection c;
  if (url_.https) {
    auto tls = std::make_unique<httplib::SSLClient>(url_.host, url_.port);
    tls->set_ca_cert_path(options_.ca_file, options_.ca_dir);
    tls->enable_server_certificate_verification(true);
    c = std::move(tls);
  } else {
    c = std::make_unique<BufferedClient>(url_.host, url_.port);
  }
  c->set_connection_timeout(std::chrono::milliseconds(options_.connect_timeout_ms));
  c->set_read_timeout(std::chrono::milliseconds(options_.read_timeout_ms));
  c->set_write_timeout(std::chrono::milliseconds(options_.read_timeout_ms));
  c->set_keep_alive(true);
  c->set_tcp_nodelay(true);
  if (!options_.bearer.empty()) c->set_bearer_token_auth(options_.bearer);
  return c;
}

ConnectionPool::Connection ConnectionPool::Take() {
  std::vector<Idle> stale;  // closed outside the lock
  {
    std::lock_guard lock(mu_);
    if (!idle_.empty()) {
      // The last given back is the freshest: when it is stale, all are.
      const bool fresh = options_.max_idle_ms <= 0 || std::chrono::steady_clock::now() - idle_.back().since <=
                                                          std::chrono::milliseconds(options_.max_idle_ms);
      if (fresh) {
        Connection c = std::move(idle_.back().connection);
        idle_.pop_back();
        return c;
      }
      stale.swap(idle_);
    }
  }
  return Open();
}

void ConnectionPool::GiveBack(Connection c) {
  std::unique_lock lock(mu_);
  if (idle_.size() < static_cast<size_t>(options_.pool_size))
    idle_.push_back({std::move(c), std::chrono::steady_clock::now()});
  lock.unlock();
  // Otherwise `c` is closed here, outside the lock.
}

ConnectionPool::Exchange ConnectionPool::Send(const std::function<httplib::Result(httplib::ClientImpl&)>& send) {
  Exchange out;
  Connection c = Take();
  httplib::Result r = send(*c);
  if (!r) {
    out.failure = Describe(r.error(), *c);
    out.sent = !FailedToConnect(r.error());
    out.permanent = Permanent(r.error());
    return out;  // `c` is closed: httplib leaves a failed connection in no known state
  }
  GiveBack(std::move(c));
  out.response = std::move(r.value());
  return out;
}

std::string ConnectionPool::Describe(httplib::Error e, const httplib::ClientImpl& c) const {
  if (e == httplib::Error::SSLServerVerification) {
    const long v = static_cast<const httplib::SSLClient&>(c).get_openssl_verify_result();
    return "TLS certificate verification failed for " + url_.host + ": " +
           (v != X509_V_OK ? std::string(X509_verify_cert_error_string(v))
                           : std::string("the certificate does not name the host")) +
           " (trust its CA with the ca_file or ca_dir option)";
  }
  if (e == httplib::Error::SSLLoadingCerts)
    return "cannot load the CA certificates (ca_file '" + options_.ca_file + "', ca_dir '" + options_.ca_dir + "')";
  if (e == httplib::Error::Read)
    return "no answer from " + url_.HostHeader() +
           " (connection closed, reset or timed out after the request was sent): " + httplib::to_string(e);
  return "connection error to " + url_.HostHeader() + ": " + httplib::to_string(e);
}

}  // namespace idem::http_internal
