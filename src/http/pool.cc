// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "http/pool.h"

#include <openssl/x509.h>

#include <chrono>
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

ConnectionPool::ConnectionPool(BaseUrl url, PoolOptions options) : url_(std::move(url)), options_(std::move(options)) {}

ConnectionPool::Connection ConnectionPool::Open() const {
  Connection c;
  if (url_.https) {
    auto tls = std::make_unique<httplib::SSLClient>(url_.host, url_.port);
    tls->set_ca_cert_path(options_.ca_file, options_.ca_dir);
    tls->enable_server_certificate_verification(true);
    c = std::move(tls);
  } else {
    c = std::make_unique<httplib::ClientImpl>(url_.host, url_.port);
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
