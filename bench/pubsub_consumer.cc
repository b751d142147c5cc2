// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Issue 36's Pub/Sub target: idem's Consumer (Inbox on SQLite, batches of B)
// against a bare pull-handle-ack loop, on the same emulator, in one run.
// Each round drains N messages (published beforehand in batches of 100 with
// the idem-id attribute) from a new subscription each way:
//   bare:  pull B (returnImmediately) -> one SQLite transaction inserting a
//          row per message -> acknowledge the B ack ids in one call
//   idem:  pubsub::Source + Consumer{batch = B} + Inbox on SQLite, the same
//          row per message, markers in the same transaction, Ack per delivery
//          (on this plain subscription Source::Ack queues the ack id; the
//          queued ids go in one acknowledge call before the next pull);
//          the Consumer stops when idle (one empty pull, receive_wait_ms 10)
// After one uncounted round each way (the emulator's JIT warms up), rounds
// alternate bare/idem/source alone; the figures are the medians, and the
// median of each round's idem/bare. One JSON line.
//   idem_pubsub_consumer_bench http://127.0.0.1:8085 N B ROUNDS DIR
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "http/base64.h"
#include "idem/consumer.h"
#include "idem/inbox.h"
#include "idem/pubsub/publisher.h"
#include "idem/pubsub/source.h"
#include "idem/sqlite/store.h"

namespace {

constexpr const char* kProject = "idem-bench";

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

[[noreturn]] void Die(const std::string& what, const idem::Status& s) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

std::unique_ptr<idem::Store> NewStore(const std::string& path) {
  std::remove(path.c_str());
  std::remove((path + "-wal").c_str());
  std::remove((path + "-shm").c_str());
  auto st = idem::sqlite::Store::Open({.path = path});
  if (!st.ok()) Die("store", st.status());
  auto tx = (*st)->Begin();
  if (!tx.ok()) Die("begin", tx.status());
  idem::Status s = (*tx)->Exec("CREATE TABLE rows(message_id TEXT NOT NULL, payload TEXT NOT NULL)").status();
  if (s.ok()) s = (*tx)->Commit();
  if (!s.ok()) Die("schema", s);
  return std::move(*st);
}

// A new subscription (and topic) holding n messages.
std::unique_ptr<idem::pubsub::Source> Fill(const std::string& endpoint, const std::string& name, int n) {
  const idem::pubsub::Connection c{.project = kProject, .endpoint = endpoint};
  auto src = idem::pubsub::Source::Open(
      {.connection = c, .subscription = "s-" + name, .create = true, .topic = "t-" + name, .lease_ms = 60'000});
  if (!src.ok()) Die("subscription", src.status());
  auto pub = idem::pubsub::Publisher::Open({.connection = c, .topic = "t-" + name, .max_batch = 100});
  if (!pub.ok()) Die("publisher", pub.status());
  std::vector<idem::Message> ms(static_cast<size_t>(n));
  std::vector<idem::Outgoing> out;
  for (int i = 0; i < n; ++i) {
    ms[static_cast<size_t>(i)].id = name + "-" + std::to_string(i);
    ms[static_cast<size_t>(i)].payload = "{\"amount\":" + std::to_string(i) + "}";
  }
  for (const idem::Message& m : ms) out.push_back({.message = &m});
  for (const idem::Status& s : (*pub)->PublishBatch(out))
    if (!s.ok()) Die("publish", s);
  return std::move(*src);
}

double Bare(const std::string& endpoint, const std::string& name, int n, int batch, const std::string& db) {
  auto store = NewStore(db);
  (void)Fill(endpoint, name, n);
  httplib::Client http(endpoint);
  http.set_keep_alive(true);
  http.set_tcp_nodelay(true);  // as idem's connection pool
  const std::string sub = std::string("/v1/projects/") + kProject + "/subscriptions/s-" + name;
  const std::string pull = nlohmann::json{{"maxMessages", batch}, {"returnImmediately", true}}.dump();
  int done = 0, empty = 0;
  const auto start = std::chrono::steady_clock::now();
  while (done < n && empty < 50) {
    auto r = http.Post(sub + ":pull", pull, "application/json");
    if (!r || r->status != 200) Die("pull", idem::Status::Unavailable(r ? r->body : "no answer"));
    nlohmann::json got = nlohmann::json::parse(r->body);
    if (!got.contains("receivedMessages")) {
      ++empty;
      continue;
    }
    auto tx = store->Begin();
    if (!tx.ok()) Die("begin", tx.status());
    nlohmann::json ack_ids = nlohmann::json::array();
    for (const auto& rm : got["receivedMessages"]) {
      const auto& m = rm["message"];
      const std::string id = m["attributes"].value("idem-id", std::string());
      const std::string payload = idem::http_internal::Base64Decode(m.value("data", std::string())).value_or("");
      idem::Status s = (*tx)->Exec("INSERT INTO rows(message_id, payload) VALUES ($1, $2)", {id, payload}).status();
      if (!s.ok()) Die("insert", s);
      ack_ids.push_back(rm["ackId"]);
    }
    if (idem::Status s = (*tx)->Commit(); !s.ok()) Die("commit", s);
    auto a = http.Post(sub + ":acknowledge", nlohmann::json{{"ackIds", ack_ids}}.dump(), "application/json");
    if (!a || a->status != 200) Die("acknowledge", idem::Status::Unavailable(a ? a->body : "no answer"));
    done += static_cast<int>(ack_ids.size());
  }
  const double s = Seconds(start);
  if (done != n) Die("bare", idem::Status::Internal("drained " + std::to_string(done) + " of " + std::to_string(n)));
  return n / s;
}

// The same loop as Bare through pubsub::Source (Receive, Ack per delivery),
// without the Consumer and the Inbox: what the adapter costs by itself.
double SourceOnly(const std::string& endpoint, const std::string& name, int n, int batch, const std::string& db) {
  auto store = NewStore(db);
  auto src = Fill(endpoint, name, n);
  int done = 0, empty = 0;
  const auto start = std::chrono::steady_clock::now();
  while (done < n && empty < 50) {
    auto got = src->Receive(batch, 0);
    if (!got.ok()) Die("receive", got.status());
    if (got->empty()) {
      ++empty;
      continue;
    }
    auto tx = store->Begin();
    if (!tx.ok()) Die("begin", tx.status());
    for (const idem::Delivery& d : *got) {
      idem::Status s =
          (*tx)
              ->Exec("INSERT INTO rows(message_id, payload) VALUES ($1, $2)", {d.message.id, d.message.payload})
              .status();
      if (!s.ok()) Die("insert", s);
    }
    if (idem::Status s = (*tx)->Commit(); !s.ok()) Die("commit", s);
    for (const idem::Delivery& d : *got)
      if (idem::Status s = src->Ack(d); !s.ok()) Die("ack", s);
    done += static_cast<int>(got->size());
  }
  const double s = Seconds(start);
  if (done != n) Die("source", idem::Status::Internal("drained " + std::to_string(done)));
  return n / s;
}

double Idem(const std::string& endpoint, const std::string& name, int n, int batch, const std::string& db) {
  auto store = NewStore(db);
  auto src = Fill(endpoint, name, n);
  auto inbox = idem::Inbox::Open(*store, {.consumer = "bench"});
  if (!inbox.ok()) Die("inbox", inbox.status());
  idem::Handler handler = [](idem::Transaction& tx, const idem::Message& m) -> idem::Status {
    return tx.Exec("INSERT INTO rows(message_id, payload) VALUES ($1, $2)", {m.id, m.payload}).status();
  };
  auto consumer =
      idem::Consumer::Open(*src, **inbox, handler, {.batch = batch, .receive_wait_ms = 10, .stop_when_idle = true});
  if (!consumer.ok()) Die("consumer", consumer.status());
  const auto start = std::chrono::steady_clock::now();
  if (idem::Status s = (*consumer)->Run(); !s.ok()) Die("run", s);
  const double s = Seconds(start);
  if ((*consumer)->stats().acked != static_cast<uint64_t>(n))
    Die("idem", idem::Status::Internal("acked " + std::to_string((*consumer)->stats().acked)));
  return n / s;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s ENDPOINT MESSAGES BATCH ROUNDS DIR\n", argv[0]);
    return 2;
  }
  const std::string endpoint = argv[1];
  const int n = std::atoi(argv[2]), batch = std::atoi(argv[3]), rounds = std::atoi(argv[4]);
  const std::string dir = argv[5];
  const std::string run = std::to_string(std::chrono::system_clock::now().time_since_epoch().count() % 1000000000);
  std::vector<double> bare, idem, source;
  // One round each way first, not counted: the emulator's JIT warms up.
  (void)Bare(endpoint, "bare-warm-" + run, n, batch, dir + "/bare.db");
  (void)Idem(endpoint, "idem-warm-" + run, n, batch, dir + "/idem.db");
  for (int r = 0; r < rounds; ++r) {
    const std::string tag = "r" + run + "-" + std::to_string(r);
    bare.push_back(Bare(endpoint, "bare-" + tag, n, batch, dir + "/bare.db"));
    idem.push_back(Idem(endpoint, "idem-" + tag, n, batch, dir + "/idem.db"));
    source.push_back(SourceOnly(endpoint, "source-" + tag, n, batch, dir + "/source.db"));
    std::fprintf(stderr, "round %d: bare %.0f/s idem %.0f/s (source alone %.0f/s)\n", r + 1, bare.back(), idem.back(),
                 source.back());
  }
  const double b = Median(bare), i = Median(idem), so = Median(source);
  // Each round's idem/bare (the two run back to back, so a slow moment of a
  // shared machine hits both), and their median.
  std::vector<double> paired;
  for (size_t k = 0; k < bare.size(); ++k) paired.push_back(idem[k] / bare[k]);
  std::printf(
      "{\"bench\":\"pubsub_consumer\",\"messages\":%d,\"batch\":%d,\"rounds\":%d,\"bare_per_s\":%.0f,"
      "\"idem_per_s\":%.0f,\"source_alone_per_s\":%.0f,\"ratio\":%.3f,\"median_round_ratio\":%.3f}\n",
      n, batch, rounds, b, i, so, i / b, Median(paired));
  return 0;
}
