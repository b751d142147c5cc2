// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "http_load.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <latch>
#include <thread>

namespace idem::cli {

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
  for (auto& t : threads) t.join();
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), unexpected.load()};
}

}  // namespace idem::cli
