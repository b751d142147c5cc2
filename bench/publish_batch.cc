// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Publish in turn vs PublishBatch on one publisher, in one run: N messages of
// SIZE bytes each way, every message with its own ordering key (as the
// outbox relay sends a publisher without ordered batches), batches of
// traits().max_batch. One JSON line: both rates in messages/s.
//   idem_publish_batch_bench 'amqp://idem:secret@127.0.0.1:5672/%2f?queue=bench' 20000 100
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "idem/open.h"
#include "idem/publisher.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s PUBLISHER_URL MESSAGES SIZE\n", argv[0]);
    return 2;
  }
  const int n = std::atoi(argv[2]);
  const size_t size = static_cast<size_t>(std::atol(argv[3]));
  auto pub = idem::OpenPublisher(argv[1]);
  if (!pub.ok()) {
    std::fprintf(stderr, "%s\n", pub.status().ToString().c_str());
    return 1;
  }
  std::vector<idem::Message> messages(static_cast<size_t>(2 * n));
  std::vector<std::string> keys(messages.size());
  for (size_t i = 0; i < messages.size(); ++i) {
    messages[i].id = "bench-" + std::to_string(i);
    messages[i].payload.assign(size, 'x');
    keys[i] = "key-" + std::to_string(i);
  }
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    idem::Status s = (*pub)->Publish(messages[static_cast<size_t>(i)]);
    if (!s.ok()) {
      std::fprintf(stderr, "Publish: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  const double in_turn = n / Seconds(start);
  const int max_batch = (*pub)->traits().max_batch;
  std::vector<idem::Outgoing> batch;
  start = std::chrono::steady_clock::now();
  for (int i = n; i < 2 * n; i += max_batch) {
    batch.clear();
    for (int j = i; j < std::min(2 * n, i + max_batch); ++j)
      batch.push_back({{}, keys[static_cast<size_t>(j)], &messages[static_cast<size_t>(j)]});
    for (const idem::Status& s : (*pub)->PublishBatch(batch))
      if (!s.ok()) {
        std::fprintf(stderr, "PublishBatch: %s\n", s.ToString().c_str());
        return 1;
      }
  }
  const double batched = n / Seconds(start);
  std::printf(
      "{\"kind\":\"%s\",\"messages\":%d,\"size\":%zu,\"max_batch\":%d,\"publish_per_s\":%.0f,\"publish_batch_per_s\":%."
      "0f,\"ratio\":%.1f}\n",
      std::string((*pub)->Kind()).c_str(), n, size, max_batch, in_turn, batched, batched / in_turn);
  return 0;
}
