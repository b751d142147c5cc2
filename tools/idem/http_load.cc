// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "http_load.h"

#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <latch>
#include <sstream>
#include <thread>

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

}  // namespace

PostedAll PostAll(int port, const std::string& path, const std::vector<HttpPost>& posts, int senders,
                  int expected_status, const std::string& who) {
  std::atomic<size_t> next{0};
  std::atomic<int64_t> unexpected{0};
  // The listen backlog is short: connect before the clock starts (a request
  // the server answers 404).
  std::latch connected(senders + 1);
  std::vector<std::thread> threads;
  for (int t = 0; t < senders; ++t) {
    threads.emplace_back([&] {
      ::httplib::Client client("127.0.0.1", port);
      client.set_keep_alive(true);
      client.set_tcp_nodelay(true);
      client.set_read_timeout(60, 0);
      for (int attempt = 0; attempt < 3 && !client.Get("/connect"); ++attempt) {
      }
      connected.arrive_and_wait();
      for (size_t i; (i = next++) < posts.size();) {
        auto r = client.Post(path, posts[i].headers, posts[i].body, "application/json");
        for (int retry = 0; !r && retry < 2; ++retry) {
          r = client.Post(path, posts[i].headers, posts[i].body, "application/json");
        }
        if ((!r || r->status != expected_status) && unexpected++ == 0) {
          std::fprintf(
              stderr, "idem %s: %s answered %s\n", who.c_str(), path.c_str(),
              r ? (std::to_string(r->status) + " " + r->body).c_str() : ::httplib::to_string(r.error()).c_str());
        }
      }
    });
  }
  connected.arrive_and_wait();
  const auto start = std::chrono::steady_clock::now();
  const ProcessCpu cpu0 = ProcessCpuNow();
  const double machine0 = MachineCpuSeconds();
  for (auto& t : threads) t.join();
  PostedAll out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.unexpected = unexpected.load();
  const ProcessCpu cpu1 = ProcessCpuNow();
  out.process_cpu_seconds = cpu1.seconds - cpu0.seconds;
  out.context_switches = cpu1.switches - cpu0.switches;
  out.machine_cpu_seconds = machine0 > 0 ? MachineCpuSeconds() - machine0 : 0;
  return out;
}

}  // namespace idem::cli
