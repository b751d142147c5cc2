// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/http/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace idem::http {
namespace {

constexpr size_t kReadBuffer = 16 * 1024;
// A response longer than this (a streamed one) goes out in pieces this size.
constexpr size_t kFlushAt = 64 * 1024;
// How often a connection waiting for its next request looks at stop().
constexpr int kIdleSliceMs = 100;

void AddressOf(const sockaddr_storage& a, std::string& ip, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf);
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof buf);
    port = ntohs(v6->sin6_port);
  }
  ip = buf;
}

// One connection's stream, for all of its requests: reads are buffered (so a
// pipelined request read with the one before it waits in the buffer), writes
// are gathered and sent together by Flush().
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(socket_t sock, int read_timeout_ms)
      : sock_(sock), read_timeout_ms_(read_timeout_ms), in_(kReadBuffer) {}

  bool is_readable() const override { return off_ < len_ || PollIn(read_timeout_ms_) > 0; }
  bool is_writable() const override { return !failed_; }

  ssize_t read(char* ptr, size_t size) override {
    // What the peer may be waiting for before it sends more (100 Continue).
    if (!out_.empty() && !Flush()) return -1;
    if (off_ == len_) {
      ssize_t n;
      do {
        n = ::recv(sock_, in_.data(), in_.size(), 0);  // SO_RCVTIMEO (the read timeout) bounds it
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n < 0 ? -1 : 0;
      off_ = 0;
      len_ = static_cast<size_t>(n);
    }
    const size_t k = std::min(size, len_ - off_);
    std::memcpy(ptr, in_.data() + off_, k);
    off_ += k;
    return static_cast<ssize_t>(k);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (failed_) return -1;
    out_.append(ptr, size);
    if (out_.size() >= kFlushAt && !Flush()) return -1;
    return static_cast<ssize_t>(size);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t n = sizeof a;
    if (::getpeername(sock_, reinterpret_cast<sockaddr*>(&a), &n) == 0) AddressOf(a, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage a{};
    socklen_t n = sizeof a;
    if (::getsockname(sock_, reinterpret_cast<sockaddr*>(&a), &n) == 0) AddressOf(a, ip, port);
  }
  socket_t socket() const override { return sock_; }

  // Sends what was written, in one send where the socket takes it all.
  bool Flush() {
    for (size_t sent = 0; sent < out_.size();) {
      const ssize_t n = ::send(sock_, out_.data() + sent, out_.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        failed_ = true;
        out_.clear();
        return false;
      }
      sent += static_cast<size_t>(n);
    }
    out_.clear();
    return !failed_;
  }

  // Waits until the next request can be read: false on stop() (`listening`
  // closed), after `keep_alive_sec` idle, or on a socket error.
  bool WaitForRequest(const std::atomic<socket_t>& listening, time_t keep_alive_sec) const {
    if (off_ < len_) return true;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(keep_alive_sec);
    while (listening != INVALID_SOCKET) {
      const int r = PollIn(kIdleSliceMs);
      if (r != 0) return r > 0;  // readable, closed by the peer (recv says so) or an error
      if (std::chrono::steady_clock::now() >= deadline) return false;
    }
    return false;
  }

 private:
  int PollIn(int timeout_ms) const {
    pollfd p{sock_, POLLIN, 0};
    int r;
    do {
      r = ::poll(&p, 1, timeout_ms);
    } while (r < 0 && errno == EINTR);
    return r;
  }

  socket_t sock_;
  int read_timeout_ms_;
  std::vector<char> in_;
  size_t off_ = 0, len_ = 0;
  std::string out_;
  bool failed_ = false;
};

}  // namespace

bool Server::process_and_close_socket(socket_t sock) {
  ConnectionStream strm(sock, static_cast<int>(read_timeout_sec_ * 1000 + read_timeout_usec_ / 1000));
  bool ret = false;
  for (size_t count = keep_alive_max_count_; count > 0 && strm.WaitForRequest(svr_sock_, keep_alive_timeout_sec_);
       --count) {
    bool connection_closed = false;
    ret = process_request(strm, /*close_connection=*/count == 1, connection_closed, nullptr);
    if (!strm.Flush()) ret = false;
    if (!ret || connection_closed) break;
  }
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ret;
}

}  // namespace idem::http
