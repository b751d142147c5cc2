// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The DynamoDB marker's cost: the same item writes handled through an
// Inbox (the marker in the same TransactWriteItems) against written bare
// (one TransactWriteItems of the items alone), on one DynamoDB endpoint
// (DynamoDB Local: scripts/test-dynamodb.sh start DIR PORT). Rounds
// alternate bare and guarded; prints the rates and guarded/bare per round
// and their median, as one JSON line at the end.
//   idem_dynamodb_guarded ENDPOINT [MESSAGES=2000] [THREADS=8] [BATCH=1] [ROUNDS=3]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "aws/client.h"
#include "idem/dynamodb/items.h"
#include "idem/dynamodb/store.h"
#include "idem/inbox.h"

namespace {

using idem::dynamodb::Attr;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s ENDPOINT [MESSAGES] [THREADS] [BATCH] [ROUNDS]\n", argv[0]);
    return 2;
  }
  const std::string endpoint = argv[1];
  const int messages = argc > 2 ? std::atoi(argv[2]) : 2000;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 8;
  const int batch = argc > 4 ? std::atoi(argv[4]) : 1;
  const int rounds = argc > 5 ? std::atoi(argv[5]) : 3;
  const std::string run = std::to_string(std::chrono::system_clock::now().time_since_epoch().count() % 1000000007);
  const std::string items_table = "bench-items-" + run;

  idem::aws_internal::ClientOptions co;
  co.region = "us-east-1";
  co.endpoint = endpoint;
  co.credentials = {"bench", "bench-secret", ""};
  auto client =
      idem::aws_internal::JsonClient::Open({"dynamodb", "DynamoDB_20120810", "application/x-amz-json-1.0"}, co);
  if (!client.ok()) return std::fprintf(stderr, "%s\n", client.status().ToString().c_str()), 1;
  auto created =
      (*client)->Call("CreateTable", {{"TableName", items_table},
                                      {"AttributeDefinitions", {{{"AttributeName", "id"}, {"AttributeType", "S"}}}},
                                      {"KeySchema", {{{"AttributeName", "id"}, {"KeyType", "HASH"}}}},
                                      {"BillingMode", "PAY_PER_REQUEST"}});
  if (!created.ok() || created->error) return std::fprintf(stderr, "cannot create %s\n", items_table.c_str()), 1;

  idem::dynamodb::Store::Options o;
  o.table = "bench-idem-" + run;
  o.region = "us-east-1";
  o.endpoint = endpoint;
  o.access_key_id = "bench";
  o.secret_access_key = "bench-secret";
  o.pool_size = threads + 2;
  auto store = idem::dynamodb::Store::Open(o);
  if (!store.ok()) return std::fprintf(stderr, "%s\n", store.status().ToString().c_str()), 1;
  auto inbox = idem::Inbox::Open(**store, idem::Inbox::Options{.consumer = "bench"});
  if (!inbox.ok()) return std::fprintf(stderr, "%s\n", inbox.status().ToString().c_str()), 1;

  // The work: one item per message.
  auto write = [&](idem::Transaction& tx, const idem::Message& m) {
    return idem::dynamodb::ItemsOf(tx).Put(items_table, {{"id", Attr::S(m.id)}, {"cents", Attr::N(4000)}});
  };
  // Runs `messages` messages on `threads` threads, `batch` per transaction;
  // returns messages per second (0 if any failed).
  auto measure = [&](bool guarded, int round) -> double {
    std::atomic<int> next{0};
    std::atomic<bool> failed{false};
    const auto t0 = Clock::now();
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&] {
        for (;;) {
          const int first = next.fetch_add(batch);
          if (first >= messages) return;
          std::vector<idem::Message> ms;
          for (int i = first; i < std::min(messages, first + batch); ++i) {
            idem::Message m;
            m.id = (guarded ? "g-" : "b-") + std::to_string(round) + "-" + std::to_string(i);
            m.payload = "4000";
            ms.push_back(std::move(m));
          }
          if (guarded) {
            for (const idem::Outcome& out : (*inbox)->HandleBatch(ms, write))
              if (!out.applied()) failed = true;
          } else {
            auto tx = (*store)->Begin();
            if (!tx.ok()) {
              failed = true;
              continue;
            }
            for (const idem::Message& m : ms)
              if (!write(**tx, m).ok()) failed = true;
            if (!(*tx)->Commit().ok()) failed = true;
          }
        }
      });
    }
    for (auto& w : workers) w.join();
    const double s = Seconds(t0);
    return failed ? 0 : messages / s;
  };
  measure(false, -1);  // warm the connections and the tables
  std::vector<double> ratios;
  for (int r = 0; r < rounds; ++r) {
    const double bare = measure(false, r);
    const double guarded = measure(true, r);
    if (bare == 0 || guarded == 0) return std::fprintf(stderr, "round %d: a write failed\n", r), 1;
    ratios.push_back(bare / guarded);  // time guarded / time bare
    std::printf("round %d: bare %.0f msg/s, guarded %.0f msg/s, guarded/bare time %.3f\n", r, bare, guarded,
                ratios.back());
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf("{\"messages\":%d,\"threads\":%d,\"batch\":%d,\"rounds\":%d,\"median_guarded_over_bare\":%.3f}\n",
              messages, threads, batch, rounds, ratios[ratios.size() / 2]);
  return 0;
}
