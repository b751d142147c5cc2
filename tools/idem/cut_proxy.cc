// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "cut_proxy.h"

#include "cli.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

namespace idem::cli {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Closes with RST instead of FIN: the other side sees "connection reset".
void Reset(int fd) {
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  ::close(fd);
}

int ConnectTo(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = res; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd >= 0 && ::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

// Copies what `from` has to `to`; false when either side is done.
bool Pump(int from, int to) {
  char buf[64 * 1024];
  ssize_t n = ::read(from, buf, sizeof buf);
  if (n <= 0) return false;
  for (ssize_t off = 0; off < n;) {
    ssize_t w = ::write(to, buf + off, static_cast<size_t>(n - off));
    if (w <= 0) return false;
    off += w;
  }
  return true;
}

}  // namespace

Result<std::unique_ptr<CutProxy>> CutProxy::Start(const std::string& host, int port) {
  int listen_port = 0;
  IDEM_ASSIGN_OR_RETURN(const int fd, ListenOnLoopback("cut proxy", 128, listen_port, /*nonblocking=*/false));
  std::unique_ptr<CutProxy> p(new CutProxy(fd, listen_port, host, port));
  if (::pipe2(p->wake_, O_CLOEXEC | O_NONBLOCK) != 0) return Status::Unavailable("cut proxy: pipe failed");
  p->thread_ = std::thread([raw = p.get()] { raw->Loop(); });
  return p;
}

CutProxy::CutProxy(int listen_fd, int port, std::string host, int target_port)
    : listen_fd_(listen_fd), port_(port), host_(std::move(host)), target_port_(target_port) {}

CutProxy::~CutProxy() {
  stop_ = true;
  if (wake_[1] >= 0) (void)!::write(wake_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  for (int fd : wake_)
    if (fd >= 0) ::close(fd);
}

void CutProxy::LoseResponses(double rate, uint64_t seed) {
  lose_seed_ = seed;
  lose_rate_ = rate;
}

void CutProxy::Cut(int64_t outage_ms) {
  outage_ms_ = outage_ms;
  ++cut_requests_;
  (void)!::write(wake_[1], "x", 1);
}

// One thread: accepts, connects each client to the target, copies both ways,
// and on a cut resets every pair and refuses connections until the outage ends.
void CutProxy::Loop() {
  struct Pair {
    int client, server;
    bool awaiting = false;  // the client sent something the target has not answered yet
  };
  std::vector<Pair> pairs;
  uint64_t seeded = lose_seed_.load();
  std::mt19937_64 lose_rng(seeded);
  std::uniform_real_distribution<double> draw(0.0, 1.0);
  int64_t handled_cuts = 0, refuse_until = 0;
  while (!stop_) {
    std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    for (const Pair& p : pairs) {
      fds.push_back({p.client, POLLIN, 0});
      fds.push_back({p.server, POLLIN, 0});
    }
    if (::poll(fds.data(), fds.size(), 200) < 0 && errno != EINTR) break;
    if (fds[1].revents & POLLIN) {
      char drain[64];
      while (::read(wake_[0], drain, sizeof drain) > 0) {
      }
    }
    if (const int64_t wanted = cut_requests_.load(); wanted != handled_cuts) {
      handled_cuts = wanted;
      ++cuts_;
      for (const Pair& p : pairs) {
        Reset(p.client);
        Reset(p.server);
        ++reset_;
      }
      pairs.clear();
      refuse_until = NowMs() + outage_ms_.load();
      continue;  // the fds polled belong to closed pairs
    }
    std::vector<Pair> keep;
    for (size_t i = 0; i < pairs.size(); ++i) {
      const pollfd& c = fds[2 + 2 * i];
      const pollfd& s = fds[3 + 2 * i];
      bool ok = true;
      if (c.revents & (POLLIN | POLLHUP | POLLERR)) {
        ok = Pump(pairs[i].client, pairs[i].server);
        pairs[i].awaiting = true;
      }
      if (ok && (s.revents & POLLIN) && pairs[i].awaiting) {
        pairs[i].awaiting = false;
        if (const uint64_t seed = lose_seed_.load(); seed != seeded) lose_rng.seed(seeded = seed);
        if (const double rate = lose_rate_.load(); rate > 0 && draw(lose_rng) < rate) {
          Reset(pairs[i].client);  // the answer is there; the client never gets it
          Reset(pairs[i].server);
          ++lost_;
          continue;
        }
      }
      if (ok && (s.revents & (POLLIN | POLLHUP | POLLERR))) ok = Pump(pairs[i].server, pairs[i].client);
      if (ok) {
        keep.push_back(pairs[i]);
      } else {
        ::close(pairs[i].client);
        ::close(pairs[i].server);
      }
    }
    pairs.swap(keep);
    if (fds[0].revents & POLLIN) {
      int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      if (NowMs() < refuse_until) {
        Reset(client);  // the link is down
        continue;
      }
      int one = 1;
      setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      int server = ConnectTo(host_, target_port_);
      if (server < 0) {
        Reset(client);
        continue;
      }
      pairs.push_back({client, server});
    }
  }
  for (const Pair& p : pairs) {
    ::close(p.client);
    ::close(p.server);
  }
}

namespace {

// Where a postgres:// URL names its hosts: [begin, end) holds
// "host:port[,host:port...]" (after any user info, before the path).
struct HostList {
  size_t begin = 0, end = 0;
  std::vector<std::pair<std::string, int>> hosts;  // (host, port: 5432 when not named)
};

Result<HostList> ParseHosts(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return Status::InvalidArgument("not a URL: cannot route it through the cut proxy");
  HostList l;
  const size_t start = scheme + 3;
  l.end = std::min(url.find_first_of("/?", start), url.size());
  const size_t at = url.rfind('@', l.end);
  l.begin = at != std::string::npos && at >= start ? at + 1 : start;
  const std::string all = url.substr(l.begin, l.end - l.begin);
  for (size_t from = 0; from <= all.size();) {
    const size_t comma = std::min(all.find(',', from), all.size());
    const std::string hostport = all.substr(from, comma - from);
    if (hostport.empty() || hostport.front() == '[')
      return Status::InvalidArgument("the store URL must name host:port pairs to cut the network to them");
    const size_t colon = hostport.rfind(':');
    std::string host = colon == std::string::npos ? hostport : hostport.substr(0, colon);
    const int port = colon == std::string::npos ? 5432 : std::atoi(hostport.c_str() + colon + 1);
    if (host.empty() || port <= 0) return Status::InvalidArgument("bad host:port '" + hostport + "' in the store URL");
    l.hosts.emplace_back(std::move(host), port);
    from = comma + 1;
  }
  return l;
}

}  // namespace

Result<std::string> RouteThrough(const std::string& url, int port, std::string& host, int& target) {
  IDEM_ASSIGN_OR_RETURN(HostList l, ParseHosts(url));
  if (l.hosts.size() != 1)
    return Status::InvalidArgument("the store URL must name one host:port to cut the network to it");
  host = l.hosts[0].first;
  target = l.hosts[0].second;
  return url.substr(0, l.begin) + "127.0.0.1:" + std::to_string(port) + url.substr(l.end);
}

Result<std::string> RouteEachThrough(const std::string& url,
                                     const std::function<Result<int>(const std::string&, int)>& route) {
  IDEM_ASSIGN_OR_RETURN(HostList l, ParseHosts(url));
  std::string hosts;
  for (const auto& [host, target] : l.hosts) {
    IDEM_ASSIGN_OR_RETURN(int port, route(host, target));
    hosts += (hosts.empty() ? "" : ",") + std::string("127.0.0.1:") + std::to_string(port);
  }
  return url.substr(0, l.begin) + hosts + url.substr(l.end);
}

}  // namespace idem::cli
