// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: the keep-alive connections under every HTTP client idem has
// (idem::http::Client, and the cloud adapters' service clients: src/aws,
// src/pubsub). A base URL, a pool of idle connections to it, and what a
// failed attempt means (cpp-httplib's errors: whether the request can have
// reached the server). No retries here: each caller has its own rules.
//
// Thread safety: a ConnectionPool may be shared; a Connection taken from it
// belongs to one thread until it is given back.
#ifndef IDEM_SRC_HTTP_POOL_H_
#define IDEM_SRC_HTTP_POOL_H_

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/result.h"

namespace idem::http_internal {

// "http://host[:port][/base/path]" or "https://...", parsed.
struct BaseUrl {
  bool https = false;
  std::string host;
  int port = 0;
  std::string path;  // "" or "/a/b" as written (%-encoded), no trailing slash
  // "host" or "host:port" when the port is not the scheme's default: the
  // Host header's value.
  std::string HostHeader() const;
};

// kInvalidArgument, naming `what` ("base URL", "endpoint") and the URL with
// its password hidden: not http(s), a query, fragment or user info, more
// than one host, a byte a request line cannot carry.
Result<BaseUrl> ParseBaseUrl(const std::string& text, std::string_view what = "base URL");

// "0x0a": a byte, for messages.
std::string HexByte(unsigned char c);
// The first byte of `s` outside [lo, hi] (tab allowed when `tab`), or -1.
int FirstByteOutside(std::string_view s, unsigned char lo, unsigned char hi, bool tab = false);

// Visible ASCII only (a space, CR or LF would end the request target).
Status CheckPath(std::string_view what, std::string_view path);
// Printable ASCII, spaces and tabs (a CR or LF would start a header).
Status CheckHeaderValue(std::string_view name, std::string_view value);

// Whether an attempt that failed with `e` cannot have sent any of the
// request: it failed while connecting (TCP or the TLS handshake).
bool FailedToConnect(::httplib::Error e);
// Failures another attempt cannot mend: the CAs cannot be loaded or do not
// vouch for the server.
bool Permanent(::httplib::Error e);

struct PoolOptions {
  // https only: the CAs trusted (ca_file, else ca_dir, else the system's);
  // the certificate is always verified, chain and host name.
  std::string ca_file;
  std::string ca_dir;
  int64_t connect_timeout_ms = 2'000;
  int64_t read_timeout_ms = 10'000;  // also the write timeout
  int pool_size = 16;                // idle connections kept
  std::string bearer;                // "Authorization: Bearer ..." when set
  // An idle connection kept longer than this is closed instead of reused
  // (0: no bound): stay clear of servers that close idle connections.
  int64_t max_idle_ms = 0;
};

class ConnectionPool {
 public:
  using Connection = std::unique_ptr<::httplib::ClientImpl>;

  ConnectionPool(BaseUrl url, PoolOptions options);
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  // An idle connection, or a new one (connects lazily, at its first request).
  // cpp-httplib checks an idle connection before it sends on it (poll, then
  // recv with MSG_PEEK): one the server closed (0 bytes, or an error) is
  // replaced by a new connection, whose failure to connect is
  // FailedToConnect: nothing was sent.
  Connection Take();
  // Back to the pool after an answered request (a connection whose request
  // failed is dropped instead: httplib leaves it in no known state).
  void GiveBack(Connection c);

  // What a failed attempt's error means, for people (names the host, and
  // for TLS what failed in the verification).
  std::string Describe(::httplib::Error e, const ::httplib::ClientImpl& c) const;

  // One request on a pooled connection, made by `send`: the answer, or why
  // none came (and whether the request may have reached the server). An
  // answered connection goes back to the pool.
  struct Exchange {
    std::optional<::httplib::Response> response;
    std::string failure;     // no answer: what failed, for people (Describe)
    bool sent = false;       // no answer, and the request may have been applied
    bool permanent = false;  // no answer, and another attempt cannot mend it
  };
  Exchange Send(const std::function<::httplib::Result(::httplib::ClientImpl&)>& send);

  const BaseUrl& url() const { return url_; }
  const PoolOptions& options() const { return options_; }

 private:
  Connection Open() const;

  const BaseUrl url_;
  const PoolOptions options_;
  std::mutex mu_;
  struct Idle {
    Connection connection;
    std::chrono::steady_clock::time_point since;
  };
  std::vector<Idle> idle_;  // guarded by mu_; the most recently given back last
};

// The numeric host and port that `get` (getpeername or getsockname) gives
// for `sock`, as cpp-httplib reports a peer; false, and both left as they
// were, on an error. Also idem::httplib::Server's.
bool SocketAddress(int (*get)(int, sockaddr*, socklen_t*), int sock, std::string& ip, int& port);

}  // namespace idem::http_internal

#endif  // IDEM_SRC_HTTP_POOL_H_
