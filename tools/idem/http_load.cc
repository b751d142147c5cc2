// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "http_load.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <strings.h>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace idem::cli {
namespace {

struct ProcessCpu {
  double seconds = 0;
  int64_t switches = 0;
};

ProcessCpu ProcessCpuNow() {
  rusage u{};
  if (::getrusage(RUSAGE_SELF, &u) != 0) return {};
  const auto secs = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return {secs(u.ru_utime) + secs(u.ru_stime), static_cast<int64_t>(u.ru_nvcsw + u.ru_nivcsw)};
}

// Every core's busy time (all but idle and iowait) from /proc/stat's "cpu"
// line, in seconds; 0 where it cannot be read.
double MachineCpuSeconds() {
  std::ifstream in("/proc/stat");
  std::string line;
  if (!std::getline(in, line) || line.rfind("cpu ", 0) != 0) return 0;
  std::istringstream fields(line.substr(4));
  double busy = 0, v = 0;
  for (int i = 0; fields >> v; ++i)
    if (i != 3 && i != 4 && i < 8) busy += v;  // user nice system [idle iowait] irq softirq steal
  const long hz = ::sysconf(_SC_CLK_TCK);
  return hz > 0 ? busy / static_cast<double>(hz) : 0;
}

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && ::strncasecmp(a.data(), b.data(), a.size()) == 0;
}

// A non-blocking keep-alive connection to 127.0.0.1:port, or -1.
int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int yes = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 ||
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The senders of PostAll: one epoll loop on the calling thread.
class Load {
 public:
  Load(int port, const std::string& path, const std::vector<HttpPost>& posts, int expected_status,
       const std::string& who)
      : port_(port), path_(path), posts_(posts), expected_(expected_status), who_(who) {}
  ~Load() {
    for (Conn& c : conns_)
      if (c.fd >= 0) ::close(c.fd);
    if (ep_ >= 0) ::close(ep_);
  }
  Load(const Load&) = delete;
  Load& operator=(const Load&) = delete;

  // Opens `n` connections, each answered once (GET /connect: any status).
  void Connect(int n) {
    ep_ = ::epoll_create1(EPOLL_CLOEXEC);
    conns_.resize(static_cast<size_t>(n));
    warm_ = true;
    for (size_t i = 0; i < conns_.size(); ++i) {
      conns_[i].index = i;
      if (Reopen(conns_[i])) Send(conns_[i], "GET /connect HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    }
    Loop();
  }

  // Sends every post; returns when each is answered or given up.
  void Run() {
    warm_ = false;
    for (Conn& c : conns_)
      if (c.fd >= 0) Next(c);
    Loop();
    for (size_t i = next_; i < posts_.size(); ++i) Unexpected("nothing (no connection left to send it on)");
  }

  int64_t unexpected() const { return unexpected_; }
  std::vector<double>& latencies_ms() { return latencies_ms_; }

 private:
  static constexpr size_t kNone = static_cast<size_t>(-1);
  struct Conn {
    size_t index = 0;
    int fd = -1;
    std::string out, in;
    size_t sent = 0;
    bool waiting = false;  // a request sent, not answered yet
    size_t post = kNone;   // the post it is (when not warming up)
    int attempts = 0;
    std::chrono::steady_clock::time_point since;  // its first send
  };

  bool Reopen(Conn& c) {
    if (c.fd >= 0) ::close(c.fd);
    c.fd = ConnectLoopback(port_);
    c.in.clear();
    if (c.fd < 0) return false;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLET;
    ev.data.u64 = c.index;
    if (::epoll_ctl(ep_, EPOLL_CTL_ADD, c.fd, &ev) == 0) return true;
    ::close(c.fd);
    c.fd = -1;
    return false;
  }

  void Send(Conn& c, std::string request) {
    c.out = std::move(request);
    c.sent = 0;
    if (!c.waiting) ++busy_;
    c.waiting = true;
    Flush(c);
  }

  // Would block: EPOLLOUT resumes; an error shows as EOF on read.
  void Flush(Conn& c) { (void)WritePending(c.fd, c.out, c.sent); }

  // Sends the next post on `c`, if one is left.
  void Next(Conn& c) {
    if (next_ >= posts_.size()) return;
    c.post = next_++;
    c.attempts = 1;
    c.since = std::chrono::steady_clock::now();
    SendPost(c);
  }

  void SendPost(Conn& c) {
    const HttpPost& p = posts_[c.post];
    std::string r = "POST " + path_ + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port_) +
                    "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(p.body.size()) + "\r\n";
    for (const auto& [k, v] : p.headers) r.append(k).append(": ").append(v).append("\r\n");
    r.append("\r\n").append(p.body);
    Send(c, std::move(r));
  }

  void Unexpected(const std::string& what) {
    if (unexpected_++ == 0)
      std::fprintf(stderr, "idem %s: %s answered %s\n", who_.c_str(), path_.c_str(), what.c_str());
  }

  void Done(Conn& c) {
    c.waiting = false;
    c.post = kNone;
    --busy_;
  }

  // The server closed `c`: a request it had not answered goes again on a new
  // connection (at most 3 attempts in all); an idle connection reconnects.
  void Closed(Conn& c) {
    const bool reopened = Reopen(c);
    if (!c.waiting) return;
    if (warm_) {
      if (reopened) return Send(c, "GET /connect HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
      return Done(c);
    }
    if (reopened && c.attempts < 3) {
      ++c.attempts;
      return SendPost(c);
    }
    Unexpected("nothing (the connection closed)");
    Done(c);
    if (c.fd >= 0) Next(c);
  }

  // Reads what arrived on `c` and handles the answer if it is complete.
  void Readable(Conn& c) {
    bool eof = !ReadAvailable(c.fd, c.in);
    if (auto head = ParseHttpHead(c.in); head && c.waiting) {
      if (head->chunked) {
        Unexpected("a chunked body (the load reads Content-Length bodies only)");
        Done(c);
        Closed(c);  // a new connection for the next post
        if (!warm_ && c.fd >= 0) Next(c);
        return;
      }
      const size_t total = head->head_size + static_cast<size_t>(head->content_length);
      if (c.in.size() >= total) {
        int status = 0;
        const std::string_view sl = head->start_line;
        if (const size_t sp = sl.find(' '); sp != std::string_view::npos)
          std::from_chars(sl.data() + sp + 1, sl.data() + sl.size(), status);
        if (!warm_ && status != expected_)
          Unexpected(std::to_string(status) + " " + c.in.substr(head->head_size, total - head->head_size));
        eof = eof || head->close;
        c.in.erase(0, total);
        if (!warm_)
          latencies_ms_.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - c.since).count());
        Done(c);
        if (eof) Reopen(c);
        if (!warm_ && c.fd >= 0) Next(c);
        return;
      }
    }
    if (eof) Closed(c);
  }

  void Loop() {
    epoll_event evs[256];
    while (busy_ > 0) {
      const int n = ::epoll_wait(ep_, evs, 256, 60'000);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {  // a minute without an answer: the rest is lost
        for (Conn& c : conns_)
          if (c.waiting && !warm_) Unexpected("nothing within 60 s");
        return;
      }
      for (int i = 0; i < n; ++i) {
        Conn& c = conns_[evs[i].data.u64];
        if (c.fd < 0) continue;
        if (evs[i].events & EPOLLOUT) Flush(c);
        if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) Readable(c);
      }
    }
  }

  const int port_;
  const std::string& path_;
  const std::vector<HttpPost>& posts_;
  const int expected_;
  const std::string& who_;
  int ep_ = -1;
  bool warm_ = false;
  std::vector<Conn> conns_;
  size_t next_ = 0;
  int busy_ = 0;  // connections waiting for an answer
  int64_t unexpected_ = 0;
  std::vector<double> latencies_ms_;  // the answered posts'
};

}  // namespace

std::optional<HttpHead> ParseHttpHead(std::string_view buf) {
  const size_t end = buf.find("\r\n\r\n");
  if (end == std::string_view::npos) return std::nullopt;
  HttpHead h;
  h.head_size = end + 4;
  const size_t sl = buf.find("\r\n");
  h.start_line = buf.substr(0, sl);
  h.headers = buf.substr(sl + 2, end + 2 - (sl + 2));
  const std::string_view cl = HttpHeaderValue(h, "Content-Length");
  if (!cl.empty()) std::from_chars(cl.data(), cl.data() + cl.size(), h.content_length);
  h.chunked = IEquals(HttpHeaderValue(h, "Transfer-Encoding"), "chunked");
  h.close = IEquals(HttpHeaderValue(h, "Connection"), "close");
  return h;
}

std::string_view HttpHeaderValue(const HttpHead& head, std::string_view name) {
  std::string_view rest = head.headers;
  while (!rest.empty()) {
    const size_t eol = rest.find("\r\n");
    const std::string_view line = rest.substr(0, eol);
    rest.remove_prefix(eol == std::string_view::npos ? rest.size() : eol + 2);
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || !IEquals(line.substr(0, colon), name)) continue;
    std::string_view v = line.substr(colon + 1);
    while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
    return v;
  }
  return {};
}

bool ReadAvailable(int fd, std::string& in) {
  char buf[16384];
  for (;;) {
    const ssize_t r = ::recv(fd, buf, sizeof buf, 0);
    if (r > 0) {
      in.append(buf, static_cast<size_t>(r));
    } else if (r < 0 && errno == EINTR) {
      continue;
    } else {
      return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
  }
}

bool WritePending(int fd, const std::string& out, size_t& sent) {
  while (sent < out.size()) {
    const ssize_t w = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    sent += static_cast<size_t>(w);
  }
  return true;
}

PostedAll PostAll(int port, const std::string& path, const std::vector<HttpPost>& posts, int senders,
                  int expected_status, const std::string& who) {
  Load load(port, path, posts, expected_status, who);
  // The listen backlog may be short: connect before the clock starts.
  load.Connect(senders);
  const auto start = std::chrono::steady_clock::now();
  const ProcessCpu cpu0 = ProcessCpuNow();
  const double machine0 = MachineCpuSeconds();
  load.Run();
  PostedAll out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.unexpected = load.unexpected();
  const ProcessCpu cpu1 = ProcessCpuNow();
  out.process_cpu_seconds = cpu1.seconds - cpu0.seconds;
  out.context_switches = cpu1.switches - cpu0.switches;
  out.machine_cpu_seconds = machine0 > 0 ? MachineCpuSeconds() - machine0 : 0;
  out.latencies_ms = std::move(load.latencies_ms());
  std::sort(out.latencies_ms.begin(), out.latencies_ms.end());
  return out;
}

}  // namespace idem::cli
