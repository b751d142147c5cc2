// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem demo: the seed's four steps, done for real on SQLite and the embedded
// queue, each outcome read back from the databases; then why the marker and
// the work must share one transaction, shown by crashing child processes at
// named kill points; then a larger run with competing consumer processes and
// injected faults, checked against the expected totals. The payment provider
// is a real HTTP server on loopback (ProviderServer, its own SQLite file),
// called with idem::http::Client and the key DownstreamKey(message, "charge").
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <system_error>
#include <thread>
#include <unordered_set>
#include <vector>

#include "commands.h"
#include "components.h"
#include "core/kill_point.h"
#include "idem/consumer.h"
#include "idem/embedded/queue.h"
#include "idem/env.h"
#include "idem/http/client.h"
#include "idem/inbox.h"
#include "idem/metrics.h"
#include "idem/open.h"
#include "idem/outbox.h"
#include "idem/outbox_relay.h"
#include "idem/sqlite/store.h"
#include "idem/testing/kill_points.h"
#include "idem/url.h"
#include "live/feed.h"
#include "live/web.h"
#include "payments.h"
#include "provider_server.h"
#include "sources.h"

namespace idem::cli {
namespace {

// ---------------------------------------------------------------- plumbing

// Removes `path` and its SQLite -wal and -shm files (absent ones are fine).
Status RemoveDbFiles(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::error_code ec;
    std::filesystem::remove(path + suffix, ec);
    if (ec) return Status::IoError("cannot remove " + path + suffix + ": " + ec.message());
  }
  return Status::OK();
}

struct Config {
  std::string dir;
  int64_t messages = 10'000;
  int consumers = 4;
  int64_t lease_ms = 500;
  double dup_rate = 0.05;
  double lost_ack_rate = 0.03;
  double stall_rate = 0.002;
  double lost_response_rate = 0.02;
  uint64_t seed = 1;
  bool json = false;
  bool story = true;
};

// Prints the narrative unless --json.
// The demo's consumer name and tables, distinct from anything a user keeps in
// a shared PostgreSQL database; each step starts by clearing them.
constexpr const char* kConsumer = "idem-demo";

// --web: the live view's feed, and how long each line of the story stays
// on screen before the next step (a person's pace); none without --web.
struct LiveDemo {
  live::Feed* feed = nullptr;
  int64_t pace_ms = 0;
  std::string socket;  // the feed's socket, for the consumer processes
};
LiveDemo g_live;

// One event of the demo's own (a hand-made delivery, a lost ack) to the page.
// (The payments consumer's, unless it names another.)
void Show(live::Note note) {
  if (note.consumer.empty()) note.consumer = kConsumer;
  if (g_live.feed != nullptr) g_live.feed->Tell(note);
}

// Tags the library's events with the consumer (process or thread) they came
// from, for the page's lanes.
class Tagged final : public Observer {
 public:
  explicit Tagged(std::string who) : who_(std::move(who)) {}
  void OnEvent(const Event& e) noexcept override {
    if (g_live.feed == nullptr) return;
    try {
      g_live.feed->Tell(live::NoteOf(e, who_));
    } catch (...) {
    }
  }

 private:
  std::string who_;
};

struct Out {
  bool quiet = false;
  void operator()(const std::string& line) const {
    if (!quiet) std::cout << line << "\n" << std::flush;
    if (g_live.feed == nullptr || line.empty()) return;
    const size_t text = line.find_first_not_of(' ');
    if (line.rfind("Step ", 0) == 0 || line.rfind("The larger run", 0) == 0 || line.rfind("Why the marker", 0) == 0) {
      g_live.feed->Step(line);
    } else {
      g_live.feed->Say(line.substr(text));
    }
    if (g_live.pace_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(g_live.pace_ms));
  }
};

std::string Dollars(int64_t cents) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "$%lld.%02lld", static_cast<long long>(cents / 100),
                static_cast<long long>(cents % 100));
  std::string s = buf;
  if (s.size() > 3 && s.compare(s.size() - 3, 3, ".00") == 0) s.resize(s.size() - 3);
  return s;
}

// The store: "" for a SQLite file in each step's directory, or --store.
std::string g_store_url;

// The second stage: the shipping consumer and its effect, one row per order
// paid (no unique key: a second application would show as a second row).
constexpr const char* kShippingConsumer = "idem-demo-shipping";
constexpr const char* kCreateShipments =
    "CREATE TABLE IF NOT EXISTS demo_shipments(order_id TEXT NOT NULL, message_id TEXT NOT NULL)";

constexpr const char* kCreateNaiveMarkers = "CREATE TABLE IF NOT EXISTS demo_processed(message_id TEXT PRIMARY KEY)";

// One step's files, in a directory of its own.
struct Files {
  std::string dir, queue, store, provider, shipping;
};
Result<Files> MakeFiles(const std::string& root, const std::string& name) {
  Files f;
  f.dir = root + "/" + name;
  std::error_code ec;
  std::filesystem::create_directories(f.dir, ec);
  if (ec) return Status::Unavailable("cannot create " + f.dir + ": " + ec.message());
  f.queue = f.dir + "/queue.db";
  f.store = g_store_url.empty() ? "sqlite:" + f.dir + "/payments.db" : g_store_url;
  f.provider = f.dir + "/provider.db";
  f.shipping = f.dir + "/shipping.db";
  return f;
}

struct Parts {
  std::unique_ptr<embedded::Queue> queue;
  std::unique_ptr<Store> store;
};
// Opens the step's queue and store; `fresh` first clears what an earlier
// step or run left in a shared store.
Result<Parts> OpenParts(const Files& f, int64_t lease_ms, bool fresh = false) {
  Parts p;
  IDEM_ASSIGN_OR_RETURN(p.queue, embedded::Queue::Open({.path = f.queue, .queue = "payments", .lease_ms = lease_ms}));
  IDEM_ASSIGN_OR_RETURN(p.store, OpenStore(f.store));
  if (fresh) {
    IDEM_RETURN_IF_ERROR(p.store->Purge(kConsumer, INT64_MAX, 10'000).status());
    IDEM_RETURN_IF_ERROR(p.store->Purge(kShippingConsumer, INT64_MAX, 10'000).status());
    IDEM_ASSIGN_OR_RETURN(auto outbox, Outbox::Open(*p.store));
    IDEM_RETURN_IF_ERROR(outbox->Purge(INT64_MAX, INT64_MAX, 10'000).status());
    IDEM_ASSIGN_OR_RETURN(auto tx, p.store->Begin());
    IDEM_RETURN_IF_ERROR(tx->Exec("DROP TABLE IF EXISTS demo_payments").status());
    IDEM_RETURN_IF_ERROR(tx->Exec("DROP TABLE IF EXISTS demo_shipments").status());
    IDEM_RETURN_IF_ERROR(tx->Exec("DROP TABLE IF EXISTS demo_processed").status());
    IDEM_RETURN_IF_ERROR(tx->Exec("DELETE FROM idem_failures WHERE consumer = $1", {kConsumer}).status());
    IDEM_RETURN_IF_ERROR(tx->Exec("DELETE FROM idem_dead_letters WHERE consumer = $1", {kConsumer}).status());
    IDEM_RETURN_IF_ERROR(tx->Commit());
  }
  IDEM_ASSIGN_OR_RETURN(auto tx, p.store->Begin());
  IDEM_RETURN_IF_ERROR(tx->Exec(CreatePaymentsSql("demo_payments")).status());
  IDEM_RETURN_IF_ERROR(tx->Exec(kCreateNaiveMarkers).status());
  IDEM_RETURN_IF_ERROR(tx->Exec(kCreateShipments).status());
  IDEM_RETURN_IF_ERROR(tx->Commit());
  return p;
}

// Waits for the next delivery (a redelivery appears once a lease expires),
// received by consumer `who` (the live view's lane).
Result<Delivery> Next(Source& q, const char* who = "consumer", int64_t wait_ms = 5'000) {
  IDEM_ASSIGN_OR_RETURN(auto got, q.Receive(1, wait_ms));
  if (got.empty()) return Status::NotFound("no delivery within " + std::to_string(wait_ms) + " ms");
  const Message& m = got.front().message;
  Show({.kind = "received", .id = m.id, .attempt = m.attempt, .who = who});
  return std::move(got.front());
}

struct Totals {
  int64_t rows = 0, cents = 0;
};
Result<Totals> PaymentsFor(Store& store, const std::string& order) {
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  IDEM_ASSIGN_OR_RETURN(Rows r, order.empty() ? tx->Query("SELECT count(*), coalesce(sum(cents), 0) FROM demo_payments")
                                              : tx->Query("SELECT count(*), coalesce(sum(cents), 0) FROM demo_payments"
                                                          " WHERE order_id = $1",
                                                          {order}));
  return Totals{r.rows[0][0].AsInt(), r.rows[0][1].AsInt()};
}

std::string Mark(bool good) { return good ? "✓" : "✕"; }

// ---------------------------------------------------------------- the provider over HTTP

// Starts the payment provider on 127.0.0.1 (any free port) on a fresh SQLite
// file of its own at `path` (charges and idempotency records). When
// `lose_response(key)` says true, the provider keeps the charge and its
// stored response but drops the connection.
Result<std::unique_ptr<ProviderServer>> StartProvider(const std::string& path, int threads,
                                                      std::function<bool(const std::string&)> lose_response,
                                                      std::function<void(const std::string&)> log = nullptr) {
  IDEM_RETURN_IF_ERROR(RemoveDbFiles(path));
  ProviderServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  // The provider's durability is its own business: WAL without an fsync per
  // commit (a process crash loses nothing; the demo crashes no provider).
  o.store_url = "sqlite:" + path + "?synchronous=normal";
  o.api_keys = {{kApiKey, kPrincipal}};
  o.threads = threads;
  o.lose_response = std::move(lose_response);
  o.log = std::move(log);
  static Tagged provider_live("provider");
  if (g_live.feed != nullptr) o.idempotency.observer = &provider_live;
  return ProviderServer::Start(std::move(o));
}

// POST /charges requests the provider received, replays included.
int64_t ProviderCalls(const ProviderServer& provider) {
  auto c = provider.counters();
  return static_cast<int64_t>(c.executed + c.replayed + c.conflicts + c.in_progress + c.rejected);
}

// ---------------------------------------------------------------- the story

// Step 1: a consumer without the guard. The ack is lost, the broker delivers
// again, the customer is charged twice.
Result<Totals> StepWithoutGuard(const std::string& root, const Out& say) {
  IDEM_ASSIGN_OR_RETURN(Files f, MakeFiles(root, "step1-no-guard"));
  IDEM_ASSIGN_OR_RETURN(Parts p, OpenParts(f, 300, true));
  IDEM_RETURN_IF_ERROR(p.queue->Publish(PaymentMessage("m-7f3", "1042", 4000)));
  say("  published m-7f3 (order 1042, charge $40) to the embedded queue");
  auto naive = [&](const Delivery& d) -> Status {
    IDEM_ASSIGN_OR_RETURN(auto tx, p.store->Begin());
    IDEM_RETURN_IF_ERROR(InsertPayment(*tx, d.message));
    return tx->Commit();
  };
  IDEM_ASSIGN_OR_RETURN(Delivery d1, Next(*p.queue));
  IDEM_RETURN_IF_ERROR(naive(d1));
  Show({.kind = "unguarded_effect", .id = "m-7f3", .detail = "charged $40", .who = "consumer"});
  Show({.kind = "ack_lost", .id = "m-7f3", .attempt = d1.message.attempt, .who = "consumer"});
  say("  delivery " + std::to_string(d1.message.attempt) + ": charged $40 and committed; the ack is lost");
  IDEM_ASSIGN_OR_RETURN(Delivery d2, Next(*p.queue));
  say("  the lease expired (300 ms), so the queue delivered m-7f3 again (delivery " +
      std::to_string(d2.message.attempt) + ")");
  IDEM_RETURN_IF_ERROR(naive(d2));
  Show({.kind = "unguarded_effect", .id = "m-7f3", .detail = "charged $40 again", .who = "consumer"});
  IDEM_RETURN_IF_ERROR(p.queue->Ack(d2));
  Show({.kind = "acked", .id = "m-7f3", .attempt = d2.message.attempt, .who = "consumer"});
  IDEM_ASSIGN_OR_RETURN(Totals t, PaymentsFor(*p.store, "1042"));
  say("  read back: " + std::to_string(t.rows) + " payment rows for order 1042, " + Dollars(t.cents) + " charged  " +
      Mark(t.cents == 4000) + (t.cents == 4000 ? "" : " charged twice"));
  return t;
}

struct GuardResult {
  Totals order_1042, order_1043;
  std::string first, second, race_a, race_b;
};

// Steps 2 and 3: the marker and the charge in one transaction; the redelivery
// is skipped; two consumers racing on one message are settled by the key.
Result<GuardResult> StepWithGuard(const std::string& root, const Out& say) {
  IDEM_ASSIGN_OR_RETURN(Files f, MakeFiles(root, "step2-guard"));
  IDEM_ASSIGN_OR_RETURN(Parts p, OpenParts(f, 300, true));
  Tagged as_consumer("consumer"), as_a("consumer-A"), as_b("consumer-B");
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<Inbox> inbox_owned,
                        Inbox::Open(*p.store, Inbox::Options{.consumer = kConsumer, .observer = &as_consumer}));
  Inbox& inbox = *inbox_owned;
  // Consumers A and B of the race: the same inbox table, told apart on the page.
  IDEM_ASSIGN_OR_RETURN(auto inbox_a, Inbox::Open(*p.store, Inbox::Options{.consumer = kConsumer, .observer = &as_a}));
  IDEM_ASSIGN_OR_RETURN(auto inbox_b, Inbox::Open(*p.store, Inbox::Options{.consumer = kConsumer, .observer = &as_b}));
  Handler charge = [](Transaction& tx, const Message& m) { return InsertPayment(tx, m); };
  GuardResult r;
  IDEM_RETURN_IF_ERROR(p.queue->Publish(PaymentMessage("m-7f3", "1042", 4000)));
  IDEM_ASSIGN_OR_RETURN(Delivery d1, Next(*p.queue));
  Outcome o1 = inbox.Handle(d1.message, charge);
  r.first = o1.ToString();
  say("  delivery 1: BEGIN; INSERT marker (payments, m-7f3); INSERT payment; COMMIT -> outcome " + r.first);
  Show({.kind = "ack_lost", .id = "m-7f3", .attempt = d1.message.attempt, .who = "consumer"});
  say("  the ack is lost again");
  say("");
  say("Step 3 · Redelivery changes nothing");
  IDEM_ASSIGN_OR_RETURN(Delivery d2, Next(*p.queue));
  Outcome o2 = inbox.Handle(d2.message, charge);
  r.second = o2.ToString();
  say("  delivery " + std::to_string(d2.message.attempt) + ": the marker exists -> outcome " + r.second +
      ", work skipped, acknowledged");
  if (o2.ShouldAck()) IDEM_RETURN_IF_ERROR(p.queue->Ack(d2));
  if (o2.ShouldAck()) Show({.kind = "acked", .id = "m-7f3", .attempt = d2.message.attempt, .who = "consumer"});
  IDEM_ASSIGN_OR_RETURN(r.order_1042, PaymentsFor(*p.store, "1042"));
  say("  read back: " + std::to_string(r.order_1042.rows) + " payment row for order 1042, " +
      Dollars(r.order_1042.cents) + " charged  " + Mark(r.order_1042.cents == 4000));

  // The race: consumer A stalls past its lease; the queue hands the message
  // to consumer B; both run the guarded handler at once.
  IDEM_RETURN_IF_ERROR(p.queue->Publish(PaymentMessage("m-8a1", "1043", 2500)));
  IDEM_ASSIGN_OR_RETURN(Delivery da, Next(*p.queue, "consumer-A"));
  IDEM_ASSIGN_OR_RETURN(Delivery db, Next(*p.queue, "consumer-B"));  // after A's lease expired
  Handler slow = [](Transaction& tx, const Message& m) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // hold the transaction open
    return InsertPayment(tx, m);
  };
  Outcome oa, ob;
  std::thread ta([&] { oa = inbox_a->Handle(da.message, slow); });
  std::thread tb([&] { ob = inbox_b->Handle(db.message, slow); });
  ta.join();
  tb.join();
  (void)p.queue->Ack(da);  // A's lease expired: kLeaseLost, harmless after the commit
  (void)p.queue->Ack(db);
  Show({.kind = "acked", .id = "m-8a1", .attempt = da.message.attempt, .who = "consumer-A"});
  Show({.kind = "acked", .id = "m-8a1", .attempt = db.message.attempt, .who = "consumer-B"});
  r.race_a = oa.ToString();
  r.race_b = ob.ToString();
  IDEM_ASSIGN_OR_RETURN(r.order_1043, PaymentsFor(*p.store, "1043"));
  say("  race: consumer A stalled past its lease on m-8a1 (order 1043, $25), so consumer B got it too;");
  say("  both ran the guarded handler at once: A -> " + r.race_a + ", B -> " + r.race_b + "; " +
      std::to_string(r.order_1043.rows) + " payment row  " + Mark(r.order_1043.rows == 1));
  return r;
}

struct ProviderResult {
  int64_t charges = 0, calls = 0, replays = 0, rows = 0;
  int attempts = 0;
  bool replayed = false;
  std::string charge_id, stored_id;
};

// Step 4: a call no transaction covers goes over HTTP to the provider with
// the key DownstreamKey(message, "charge"); the provider charges but its
// response is lost; the client retries with the same key and gets the
// stored response (Idempotent-Replayed: true); one charge.
Result<ProviderResult> StepProvider(const std::string& root, const Out& say) {
  IDEM_ASSIGN_OR_RETURN(Files f, MakeFiles(root, "step4-provider"));
  IDEM_ASSIGN_OR_RETURN(Parts p, OpenParts(f, 300, true));
  // The provider's own log, printed as it happens (the consumer is waiting
  // on its call meanwhile). Declared before the server: it outlives it.
  std::mutex mu;
  bool lost_one = false, dropping = false;
  auto lose_first = [&](const std::string& key) {
    std::lock_guard lock(mu);
    if (lost_one) return false;
    Show({.kind = "provider_response_lost", .id = key, .who = "provider"});
    return lost_one = dropping = true;
  };
  auto log = [&](const std::string& line) {
    std::lock_guard lock(mu);
    say("    provider: " + line + (dropping ? "; then it drops the connection: the response is lost" : ""));
    dropping = false;
  };
  IDEM_ASSIGN_OR_RETURN(auto provider, StartProvider(f.provider, 4, lose_first, log));
  IDEM_ASSIGN_OR_RETURN(auto client, ProviderClient(provider->url()));
  say("  the provider: an HTTP server on " + provider->url() + " with a database of its own (provider.db)");
  Tagged as_consumer("consumer");
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<Inbox> inbox_owned,
                        Inbox::Open(*p.store, Inbox::Options{.consumer = kConsumer, .observer = &as_consumer}));
  Inbox& inbox = *inbox_owned;
  ProviderResult r;
  Handler charge = [&](Transaction& tx, const Message& m) -> Status {
    IDEM_ASSIGN_OR_RETURN(auto pay, ParsePayment(m));
    say("  delivery " + std::to_string(m.attempt) +
        ": BEGIN; INSERT marker; POST /charges Idempotency-Key: " + http::QuoteKey(DownstreamKey(m, "charge")));
    say("    " + ChargeBody(pay.first, pay.second));
    IDEM_ASSIGN_OR_RETURN(ChargeReply c, Charge(*client, m));
    r.charge_id = c.charge_id;
    r.attempts = c.attempts;
    r.replayed = c.replayed;
    say("  the client " +
        std::string(c.attempts > 1 ? "saw the connection break and retried with the same key: attempt " +
                                         std::to_string(c.attempts) + " -> "
                                   : "got ") +
        "201, Idempotent-Replayed: " + (c.replayed ? "true" : "false") + ", charge " + c.charge_id);
    return InsertPayment(tx, m, c.charge_id);
  };
  IDEM_RETURN_IF_ERROR(p.queue->Publish(PaymentMessage("m-7f3", "1042", 4000)));
  IDEM_ASSIGN_OR_RETURN(Delivery d1, Next(*p.queue));
  Outcome o1 = inbox.Handle(d1.message, charge);
  say("  INSERT payment (charge " + r.charge_id + "); COMMIT -> outcome " + o1.ToString() +
      (o1.ShouldAck() ? "; acknowledged" : ""));
  if (o1.ShouldAck()) IDEM_RETURN_IF_ERROR(p.queue->Ack(d1));
  if (o1.ShouldAck()) Show({.kind = "acked", .id = "m-7f3", .attempt = d1.message.attempt, .who = "consumer"});
  say("  (had every retry failed, the transaction would roll back, and the redelivery would send the same key)");

  // Read back: the provider's charges over HTTP, and what it received.
  IDEM_ASSIGN_OR_RETURN(http::Response listed, client->Get("/charges?customer=cus_1042"));
  nlohmann::json list = nlohmann::json::parse(listed.body, nullptr, /*allow_exceptions=*/false);
  int64_t cents = 0;
  if (listed.status == 200 && list.is_object() && list.contains("data") && list["data"].is_array()) {
    r.charges = static_cast<int64_t>(list["data"].size());
    for (const auto& c : list["data"]) {
      cents += c.value("amount", int64_t{0});
      r.stored_id = c.value("id", std::string());
    }
  }
  r.calls = ProviderCalls(*provider);
  r.replays = static_cast<int64_t>(provider->counters().replayed);
  IDEM_ASSIGN_OR_RETURN(Totals t, PaymentsFor(*p.store, "1042"));
  r.rows = t.rows;
  say("  read back: GET /charges?customer=cus_1042 -> " + std::to_string(r.charges) + " charge (" + Dollars(cents) +
      ", " + r.stored_id + "); provider calls " + std::to_string(r.calls) + " (" + std::to_string(r.replays) +
      " replayed); payment rows " + std::to_string(t.rows) + "  " +
      Mark(r.charges == 1 && t.rows == 1 && r.stored_id == r.charge_id));
  return r;
}

// The ways to record the marker and the work, crashed between the two.
enum class Strategy { kIdFirst, kWorkFirst, kOneTransaction };

Status HandleWith(Strategy s, Parts& p, Inbox& inbox, const Delivery& d) {
  switch (s) {
    case Strategy::kIdFirst: {
      {
        IDEM_ASSIGN_OR_RETURN(auto tx, p.store->Begin());
        IDEM_ASSIGN_OR_RETURN(int64_t n, tx->Exec("INSERT INTO demo_processed(message_id) VALUES ($1)"
                                                  " ON CONFLICT DO NOTHING",
                                                  {d.message.id}));
        IDEM_RETURN_IF_ERROR(tx->Commit());
        if (n == 0) return p.queue->Ack(d);  // "already handled"
      }
      IDEM_KILL_POINT("demo.between_writes");
      IDEM_ASSIGN_OR_RETURN(auto tx, p.store->Begin());
      IDEM_RETURN_IF_ERROR(InsertPayment(*tx, d.message));
      IDEM_RETURN_IF_ERROR(tx->Commit());
      return p.queue->Ack(d);
    }
    case Strategy::kWorkFirst: {
      {
        IDEM_ASSIGN_OR_RETURN(auto tx, p.store->Begin());
        IDEM_ASSIGN_OR_RETURN(Rows seen,
                              tx->Query("SELECT 1 FROM demo_processed WHERE message_id = $1", {d.message.id}));
        if (!seen.rows.empty()) return p.queue->Ack(d);
        IDEM_RETURN_IF_ERROR(InsertPayment(*tx, d.message));
        IDEM_RETURN_IF_ERROR(tx->Commit());
      }
      IDEM_KILL_POINT("demo.between_writes");
      IDEM_ASSIGN_OR_RETURN(auto tx, p.store->Begin());
      IDEM_RETURN_IF_ERROR(tx->Exec("INSERT INTO demo_processed(message_id) VALUES ($1)", {d.message.id}).status());
      IDEM_RETURN_IF_ERROR(tx->Commit());
      return p.queue->Ack(d);
    }
    case Strategy::kOneTransaction: {
      Outcome o = inbox.Handle(d.message, [](Transaction& tx, const Message& m) { return InsertPayment(tx, m); });
      if (!o.ShouldAck()) return o.status;
      return p.queue->Ack(d);
    }
  }
  return Status::Internal("unknown strategy");
}

struct CrashResult {
  std::string name, kill_point;
  bool killed = false;
  int64_t rows = 0;
};

// Publishes one message, lets a child process handle it with `kill_point`
// armed (the child is SIGKILLed there), then redelivers it to a clean
// consumer once the lease expires, and counts the charges.
Result<CrashResult> CrashScenario(const std::string& root, const std::string& name, Strategy s,
                                  const std::string& kill_point) {
  IDEM_ASSIGN_OR_RETURN(Files f, MakeFiles(root, "crash-" + name));
  constexpr int64_t kLease = 300;
  {
    IDEM_ASSIGN_OR_RETURN(Parts p, OpenParts(f, kLease, true));
    IDEM_RETURN_IF_ERROR(p.queue->Publish(PaymentMessage("m-7f3", "1042", 4000)));
  }
  std::cout.flush();
  pid_t pid = ::fork();
  if (pid < 0) return Status::Unavailable("fork failed");
  if (pid == 0) {
    auto p = OpenParts(f, kLease);
    if (!p.ok()) ::_exit(10);
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<Inbox> inbox_owned,
                          Inbox::Open(*p->store, Inbox::Options{.consumer = kConsumer}));
    Inbox& inbox = *inbox_owned;
    ArmKillPoint(kill_point);
    auto d = Next(*p->queue);
    if (!d.ok()) ::_exit(11);
    Status st = HandleWith(s, *p, inbox, *d);
    ::_exit(st.ok() ? 0 : 12);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  CrashResult r{name, kill_point, WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, 0};
  if (!r.killed) return Status::Internal("crash scenario " + name + ": the child was not killed at " + kill_point);
  IDEM_ASSIGN_OR_RETURN(Parts p, OpenParts(f, kLease));
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<Inbox> inbox_owned,
                        Inbox::Open(*p.store, Inbox::Options{.consumer = kConsumer}));
  Inbox& inbox = *inbox_owned;
  IDEM_ASSIGN_OR_RETURN(Delivery d, Next(*p.queue));  // the redelivery, after the lease
  IDEM_RETURN_IF_ERROR(HandleWith(s, p, inbox, d));
  IDEM_ASSIGN_OR_RETURN(Totals t, PaymentsFor(*p.store, "1042"));
  r.rows = t.rows;
  return r;
}

// ---------------------------------------------------------------- the larger run

using Stats = std::map<std::string, int64_t>;

Status WriteStats(const std::string& path, const Stats& s) {
  std::ofstream out(path + ".tmp");
  for (const auto& [k, v] : s) out << k << " " << v << "\n";
  out.close();
  if (!out) return Status::IoError("cannot write " + path);
  std::error_code ec;
  std::filesystem::rename(path + ".tmp", path, ec);
  if (ec) return Status::IoError("cannot write " + path + ": " + ec.message());
  return Status::OK();
}
Stats ReadStats(const std::string& path) {
  Stats s;
  std::ifstream in(path);
  std::string k;
  int64_t v;
  while (in >> k >> v) s[k] = v;
  return s;
}

// One competing consumer process: waits for the provider's port on `port_fd`
// (the parent starts the provider once its children are forked), then runs
// until the queue is empty.
int ConsumerProcess(const Config& cfg, const Files& f, int index, int port_fd) {
  int port = 0;
  ssize_t got = ::read(port_fd, &port, sizeof port);
  ::close(port_fd);
  if (got != static_cast<ssize_t>(sizeof port) || port <= 0) return 22;  // the provider did not start
  auto queue = embedded::Queue::Open({.path = f.queue, .queue = "payments", .lease_ms = cfg.lease_ms});
  auto store = OpenStore(f.store);
  if (!queue.ok() || !store.ok()) {
    std::cerr << "consumer " << index << ": " << (!queue.ok() ? queue.status() : store.status()) << "\n";
    return 20;
  }
  ThreadClients clients("http://127.0.0.1:" + std::to_string(port));
  FaultySource source(**queue, cfg.seed * 7919 + index, cfg.lost_ack_rate, cfg.stall_rate, cfg.lease_ms + 200);
  // --web: this process's events to the parent's live view (dropped, never
  // waited for, when the page's feed falls behind).
  std::unique_ptr<live::Sender> sender;
  if (!g_live.socket.empty()) {
    auto sent = live::Sender::Open(g_live.socket, "consumer-" + std::to_string(index));
    if (sent.ok()) sender = std::move(*sent);
  }
  if (sender) {
    source.on_event = [&sender](char event, const Delivery& d) {
      if (event == 'L')
        sender->Tell({.kind = "ack_lost", .id = d.message.id, .attempt = d.message.attempt, .consumer = kConsumer});
    };
  }
  auto inbox_owned = Inbox::Open(**store, Inbox::Options{.consumer = kConsumer, .observer = sender.get()});
  if (!inbox_owned.ok()) {
    std::cerr << "consumer " << index << ": " << inbox_owned.status() << "\n";
    return 20;
  }
  Inbox& inbox = **inbox_owned;
  auto outbox = Outbox::Open(**store, {.observer = sender.get()});
  if (!outbox.ok()) {
    std::cerr << "consumer " << index << ": " << outbox.status() << "\n";
    return 20;
  }
  std::atomic<int64_t> retries{0}, replays{0}, provider_errors{0};
  Handler handler = [&](Transaction& tx, const Message& m) -> Status {
    IDEM_ASSIGN_OR_RETURN(auto pay, ParsePayment(m));
    IDEM_ASSIGN_OR_RETURN(http::Client * client, clients.Get());
    auto c = Charge(*client, m);
    if (!c.ok()) {
      ++provider_errors;  // the transaction rolls back; the redelivery sends the same key
      return c.status();
    }
    retries += c->attempts - 1;
    replays += c->replayed;
    IDEM_RETURN_IF_ERROR(InsertPayment(tx, m, c->charge_id));
    // "order paid", for the shipping service: committed with the payment.
    OutgoingMessage paid{.destination = "shipping", .key = pay.first, .payload = pay.first};
    return (*outbox)->Add(tx, paid.CausedBy(m)).status();
  };
  auto consumer_owned = Consumer::Open(source, inbox, handler,
                                       Consumer::Options{.workers = 1,
                                                         .batch = 1,
                                                         .max_attempts = 20,
                                                         .backoff_base_ms = 10,
                                                         .backoff_max_ms = 200,
                                                         .receive_wait_ms = 100,
                                                         .stop_when_idle = true});
  if (!consumer_owned.ok()) {
    std::cerr << "consumer " << index << ": " << consumer_owned.status() << "\n";
    return 20;
  }
  Consumer& consumer = **consumer_owned;
  StopOnSignals(&consumer);
  for (;;) {
    (void)consumer.Run();
    if (consumer.stopping()) break;
    auto st = (*queue)->Stats();
    if (st.ok() && st->ready + st->leased + st->delayed == 0) break;
  }
  StopOnSignals(nullptr);
  InboxCounters ic = inbox.counters();
  ConsumerStats cs = consumer.stats();
  Stats s{{"deliveries", static_cast<int64_t>(source.received.load())},
          {"lost_acks", static_cast<int64_t>(source.lost_acks.load())},
          {"stalls", static_cast<int64_t>(source.stalls.load())},
          {"stale_acks", static_cast<int64_t>(source.stale_acks.load())},
          {"applied", static_cast<int64_t>(ic.applied)},
          {"duplicates", static_cast<int64_t>(ic.duplicates)},
          {"conflicts", static_cast<int64_t>(ic.conflicts)},
          {"failures", static_cast<int64_t>(ic.failures)},
          {"dead_lettered", static_cast<int64_t>(cs.dead_lettered)},
          {"provider_retries", retries.load()},
          {"provider_replays_seen", replays.load()},
          {"provider_errors", provider_errors.load()}};
  return WriteStats(f.dir + "/consumer-" + std::to_string(index) + ".stats", s).ok() ? 0 : 21;
}

// The lost responses of the larger run, decided by the provider (seeded, at
// --lost-response-rate) on a key's first execution only: the retry with the
// same key gets the stored response.
class LossInjector {
 public:
  LossInjector(uint64_t seed, double rate) : rng_(seed), rate_(rate) {}
  bool operator()(const std::string& key) {
    std::lock_guard lock(mu_);
    if (!seen_.insert(key).second) return false;
    if (std::uniform_real_distribution<double>(0, 1)(rng_) >= rate_) return false;
    ++lost_;
    return true;
  }
  int64_t lost() {
    std::lock_guard lock(mu_);
    return lost_;
  }

 private:
  std::mutex mu_;
  std::mt19937_64 rng_;
  double rate_;
  std::unordered_set<std::string> seen_;
  int64_t lost_ = 0;
};

// The second stage of the larger run.
struct ShippingResult {
  bool relay_killed = false;
  int64_t relayed = 0, republished = 0, outbox_left = 0;
  int64_t deliveries = 0, lost_acks = 0, duplicates = 0, shipments = 0, orders = 0, queue_left = 0;
};

// A relay publishing to `to` until the outbox is empty.
Result<OutboxRelayStats> DrainOutbox(const std::string& store_url, const std::string& to) {
  IDEM_ASSIGN_OR_RETURN(auto store, OpenStore(store_url));
  IDEM_ASSIGN_OR_RETURN(auto publisher, OpenPublisher(to));
  static Tagged relay_live("relay");
  IDEM_ASSIGN_OR_RETURN(
      auto relay, OutboxRelay::Open(
                      *store, *publisher,
                      {.name = "idem-demo", .stop_when_idle = true, .observer = g_live.feed ? &relay_live : nullptr}));
  IDEM_RETURN_IF_ERROR(relay->Run());
  return relay->stats();
}

// The payments consumers added "order paid" to their outbox with each
// payment. A relay process publishes it to the shipping queue and is
// SIGKILLed after the broker took its first batch, before it recorded it;
// a second relay publishes that batch again (same ids) and the rest; the
// shipping consumer, losing some acks, applies each order once with its
// own Inbox.
Result<ShippingResult> ShippingStage(const Config& cfg, const Files& f) {
  const std::string to = "embedded:" + f.shipping + "?queue=shipping";
  ShippingResult r;
  std::cout.flush();
  pid_t pid = ::fork();
  if (pid < 0) return Status::Unavailable("fork failed");
  if (pid == 0) {
    ArmKillPoint("relay.after_publish");
    ::_exit(DrainOutbox(f.store, to).ok() ? 0 : 12);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.relay_killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  IDEM_ASSIGN_OR_RETURN(OutboxRelayStats relayed, DrainOutbox(f.store, to));
  r.relayed = static_cast<int64_t>(relayed.published);
  r.republished = static_cast<int64_t>(relayed.republished);

  IDEM_ASSIGN_OR_RETURN(auto queue,
                        embedded::Queue::Open({.path = f.shipping, .queue = "shipping", .lease_ms = cfg.lease_ms}));
  IDEM_ASSIGN_OR_RETURN(auto store, OpenStore(f.store));
  static Tagged shipping_live("shipping");
  IDEM_ASSIGN_OR_RETURN(auto inbox,
                        Inbox::Open(*store, Inbox::Options{.consumer = kShippingConsumer,
                                                           .observer = g_live.feed ? &shipping_live : nullptr}));
  FaultySource source(*queue, cfg.seed * 104'729 + 3, cfg.lost_ack_rate, 0, 0);
  Handler ship = [](Transaction& tx, const Message& m) {
    return tx.Exec("INSERT INTO demo_shipments(order_id, message_id) VALUES ($1, $2)", {m.payload, m.id}).status();
  };
  IDEM_ASSIGN_OR_RETURN(auto consumer, Consumer::Open(source, *inbox, ship,
                                                      Consumer::Options{.workers = cfg.consumers,
                                                                        .batch = 100,
                                                                        .max_attempts = 20,
                                                                        .receive_wait_ms = 100,
                                                                        .stop_when_idle = true}));
  for (;;) {  // lost acks come back once their lease ends
    IDEM_RETURN_IF_ERROR(consumer->Run());
    IDEM_ASSIGN_OR_RETURN(auto qs, queue->Stats());
    r.queue_left = qs.ready + qs.leased + qs.delayed;
    if (r.queue_left == 0) break;
  }
  r.deliveries = static_cast<int64_t>(source.received.load());
  r.lost_acks = static_cast<int64_t>(source.lost_acks.load());
  r.duplicates = static_cast<int64_t>(inbox->counters().duplicates);
  IDEM_ASSIGN_OR_RETURN(auto tx, store->Begin());
  IDEM_ASSIGN_OR_RETURN(Rows rows, tx->Query("SELECT count(*), count(DISTINCT order_id) FROM demo_shipments"));
  r.shipments = rows.rows[0][0].AsInt();
  r.orders = rows.rows[0][1].AsInt();
  IDEM_ASSIGN_OR_RETURN(auto outbox, Outbox::Open(*store));
  IDEM_ASSIGN_OR_RETURN(OutboxStats os, outbox->Stats());
  r.outbox_left = os.backlog;
  return r;
}

struct RunResult {
  Json json;
  bool ok = false;
};

Result<RunResult> LargerRun(const Config& cfg, const Out& say) {
  IDEM_ASSIGN_OR_RETURN(Files f, MakeFiles(cfg.dir, "run"));
  for (const char* name : {"queue.db", "payments.db", "provider.db", "shipping.db"})
    IDEM_RETURN_IF_ERROR(RemoveDbFiles(f.dir + "/" + name));
  std::mt19937_64 rng(cfg.seed);
  int64_t expected = 0, published = 0;
  auto started = std::chrono::steady_clock::now();
  {
    IDEM_ASSIGN_OR_RETURN(Parts p, OpenParts(f, cfg.lease_ms, true));
    std::vector<Message> again;
    Progress progress("publishing", cfg.messages);
    for (int64_t i = 0; i < cfg.messages; ++i) {
      char id[40];
      std::snprintf(id, sizeof id, "pay-%08llx-%06lld", static_cast<unsigned long long>(rng() & 0xffffffff),
                    static_cast<long long>(i));
      int64_t cents = 100 + static_cast<int64_t>(rng() % 99'900);
      Message m = PaymentMessage(id, std::to_string(100000 + i), cents);
      expected += cents;
      IDEM_RETURN_IF_ERROR(p.queue->Publish(m));
      ++published;
      if (std::uniform_real_distribution<double>(0, 1)(rng) < cfg.dup_rate) again.push_back(m);
      progress.Update(i + 1);
    }
    progress.Done();
    // The producer's retries: the same facts published a second time.
    for (const Message& m : again) {
      IDEM_RETURN_IF_ERROR(p.queue->Publish(m));
      ++published;
    }
  }
  say("  published " + std::to_string(cfg.messages) + " payment messages plus " +
      std::to_string(published - cfg.messages) + " producer duplicates; starting " + std::to_string(cfg.consumers) +
      " consumer processes");
  std::cout.flush();
  // The children are forked before the provider's server threads start (a
  // child of a threaded process could inherit a lock some thread holds);
  // each waits for the provider's port on a pipe.
  int port_pipe[2];
  if (::pipe(port_pipe) != 0) return Status::Unavailable("pipe failed");
  std::vector<pid_t> pids;
  for (int i = 0; i < cfg.consumers; ++i) {
    pid_t pid = ::fork();
    if (pid < 0) break;
    if (pid == 0) {
      ::close(port_pipe[1]);
      ::_exit(ConsumerProcess(cfg, f, i, port_pipe[0]));
    }
    pids.push_back(pid);
  }
  ::close(port_pipe[0]);
  auto loss = std::make_shared<LossInjector>(cfg.seed * 6151 + 17, cfg.lost_response_rate);
  Result<std::unique_ptr<ProviderServer>> provider = Status::Unavailable("fork failed");
  if (pids.size() == static_cast<size_t>(cfg.consumers))
    provider = StartProvider(f.provider, cfg.consumers + 8, [loss](const std::string& key) { return (*loss)(key); });
  if (provider.ok()) {
    const int port = (*provider)->port();
    for (size_t i = 0; i < pids.size(); ++i)
      if (::write(port_pipe[1], &port, sizeof port) != static_cast<ssize_t>(sizeof port)) break;
  }
  ::close(port_pipe[1]);  // without a provider, the children end at once
  int failed_children = 0;
  {
    auto queue = embedded::Queue::Open({.path = f.queue, .queue = "payments", .lease_ms = cfg.lease_ms});
    Progress progress("consuming", published);
    size_t running = pids.size();
    while (running > 0) {
      int status = 0;
      pid_t done = ::waitpid(-1, &status, WNOHANG);
      if (done > 0) {
        --running;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed_children;
        continue;
      }
      if (queue.ok()) {
        auto st = (*queue)->Stats();
        if (st.ok()) progress.Update(st->acked);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    progress.Done();
  }
  if (!provider.ok()) return provider.status();
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  Stats sum;
  for (int i = 0; i < cfg.consumers; ++i)
    for (const auto& [k, v] : ReadStats(f.dir + "/consumer-" + std::to_string(i) + ".stats")) sum[k] += v;
  const std::string provider_url = (*provider)->url();
  const int64_t calls = ProviderCalls(**provider);
  const int64_t replays = static_cast<int64_t>((*provider)->counters().replayed);
  (*provider)->Stop();
  IDEM_ASSIGN_OR_RETURN(ProviderTotals charges, ProviderCharges(f.provider));
  IDEM_ASSIGN_OR_RETURN(ShippingResult ship, ShippingStage(cfg, f));
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  IDEM_ASSIGN_OR_RETURN(Parts p, OpenParts(f, cfg.lease_ms));
  IDEM_ASSIGN_OR_RETURN(Totals pay, PaymentsFor(*p.store, ""));
  IDEM_ASSIGN_OR_RETURN(auto qs, p.queue->Stats());
  IDEM_ASSIGN_OR_RETURN(int64_t markers, p.store->CountMarkers(kConsumer));
  IDEM_ASSIGN_OR_RETURN(auto dead, p.store->ListDeadLetters(kConsumer, 1000));
  int64_t left = qs.ready + qs.leased + qs.delayed;

  RunResult r;
  r.ok = failed_children == 0 && pay.rows == cfg.messages && pay.cents == expected && charges.charges == cfg.messages &&
         charges.keys == cfg.messages && charges.cents == expected && markers == cfg.messages && left == 0 &&
         dead.empty();
  const bool shipped_once = ship.relay_killed && ship.relayed >= cfg.messages && ship.shipments == cfg.messages &&
                            ship.orders == cfg.messages && ship.outbox_left == 0 && ship.queue_left == 0;
  r.ok = r.ok && shipped_once;
  r.json.Add("messages", cfg.messages)
      .Add("published", published)
      .Add("producer_duplicates", published - cfg.messages)
      .Add("consumers", cfg.consumers)
      .Add("deliveries", sum["deliveries"])
      .Add("duplicates_skipped", sum["duplicates"])
      .Add("lost_acks", sum["lost_acks"])
      .Add("lease_expiries", sum["stalls"])
      .Add("lost_provider_responses", loss->lost())
      .Add("provider_retries", sum["provider_retries"])
      .Add("provider_replays", replays)
      .Add("provider_errors", sum["provider_errors"])
      .Add("handler_failures", sum["failures"])
      .Add("provider_calls", calls)
      .Add("charges", charges.charges)
      .Add("payment_rows", pay.rows)
      .Add("markers", markers)
      .Add("dead_letters", static_cast<int64_t>(dead.size()))
      .Add("queue_left", left)
      .Add("charged_cents", charges.cents)
      .Add("expected_cents", expected)
      .Add("relay_killed", ship.relay_killed)
      .Add("relayed", ship.relayed)
      .Add("relay_republished", ship.republished)
      .Add("outbox_left", ship.outbox_left)
      .Add("shipping_deliveries", ship.deliveries)
      .Add("shipping_lost_acks", ship.lost_acks)
      .Add("shipping_duplicates_skipped", ship.duplicates)
      .Add("shipments", ship.shipments)
      .Add("shipping_queue_left", ship.queue_left)
      .Add("seconds", seconds)
      .Add("seed", static_cast<int64_t>(cfg.seed))
      .Add("provider", provider_url)
      .Add("dir", cfg.dir);
  if (failed_children > 0) say("  " + std::to_string(failed_children) + " consumer process(es) failed");
  say("");
  auto row = [&](const std::string& k, const std::string& v) {
    say("  " + k + std::string(k.size() < 38 ? 38 - k.size() : 1, ' ') + v);
  };
  row("messages (unique)", std::to_string(cfg.messages));
  row("published (with producer retries)", std::to_string(published));
  row("deliveries", std::to_string(sum["deliveries"]));
  row("lost acks (injected)", std::to_string(sum["lost_acks"]));
  row("lease expiries (stalled consumers)", std::to_string(sum["stalls"]));
  row("duplicates skipped by the marker", std::to_string(sum["duplicates"]));
  row("lost provider responses (injected)", std::to_string(loss->lost()));
  row("client retries with the same key", std::to_string(sum["provider_retries"]));
  row("responses replayed by the provider", std::to_string(replays));
  row("provider calls (POST /charges)", std::to_string(calls));
  row("charges made (provider's database)",
      std::to_string(charges.charges) + "  " + Mark(charges.charges == cfg.messages && charges.keys == cfg.messages));
  row("payment rows", std::to_string(pay.rows) + "  " + Mark(pay.rows == cfg.messages));
  row("total charged", Dollars(charges.cents));
  row("expected", Dollars(expected) + "  " + Mark(charges.cents == expected && pay.cents == expected));
  row("left in the queue / dead letters", std::to_string(left) + " / " + std::to_string(dead.size()));
  say("  second stage: each payment added \"order paid\" to the outbox in its transaction; a relay");
  say("  published them to the shipping queue and was SIGKILLed after the broker took a batch, before");
  say("  recording it; a second relay published that batch again; the shipping consumer applied them");
  row("relayed to the shipping queue",
      std::to_string(ship.relayed) + " (" + std::to_string(ship.republished) + " republished, same ids)");
  row("shipping deliveries", std::to_string(ship.deliveries) + " (" + std::to_string(ship.lost_acks) + " acks lost)");
  row("duplicates skipped by shipping's inbox", std::to_string(ship.duplicates));
  row("shipments", std::to_string(ship.shipments) + "  " + Mark(shipped_once));
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f s", seconds);
  row("time", secs);
  say(r.ok ? "  OK: every message charged exactly once, every order shipped once" : "  FAILED: the totals differ");
  say("  see what is stored: idem inspect --store '" + RedactUrl(f.store) + "' --consumer " + kConsumer +
      " --queue 'embedded:" + f.queue + "?queue=payments'");
  say("  and the provider's idempotency records: idem inspect --store 'sqlite:" + f.provider + "'");
  return r;
}

// ------------------------------------------------- the run on another source

// Drops a share of acks (reports OK, acks nothing), as a broker that loses
// them would; the broker delivers those messages again.
class DropAcks final : public Source {
 public:
  DropAcks(Source& inner, double rate, uint64_t seed) : inner_(inner), rate_(rate), rng_(seed) {}
  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override { return inner_.Receive(max, wait_ms); }
  Status Ack(const Delivery& d) override {
    {
      std::lock_guard lock(mu_);
      if (static_cast<double>(rng_() % 1'000'000) / 1e6 < rate_) {
        ++dropped_;
        return Status::OK();
      }
    }
    return inner_.Ack(d);
  }
  Status Nack(const Delivery& d, int64_t delay_ms) override { return inner_.Nack(d, delay_ms); }
  std::string_view Kind() const override { return inner_.Kind(); }
  int64_t dropped() {
    std::lock_guard lock(mu_);
    return dropped_;
  }

 private:
  Source& inner_;
  double rate_;
  std::mutex mu_;
  std::mt19937_64 rng_;
  int64_t dropped_ = 0;
};

// A source URL with its password hidden.
std::string RedactedSource(const std::string& url) { return RedactUrl(url); }

// `idem demo --source URL`: the larger run on a broker. Payment messages (a
// share published twice) go through the source; consumers charge over HTTP
// with DownstreamKey and record the payment with the marker in one
// transaction; some acks are lost and some provider responses too. A second
// consumer (a fresh connection or group member) then takes over what the
// first left unacknowledged. Checked from the databases: one charge and one
// payment row per message.
int RunDemoOnSource(const Config& cfg, const std::string& source_url, const Out& say) {
  const std::string cmd = "demo";
  auto t0 = std::chrono::steady_clock::now();
  const std::string dir = cfg.dir + "/on-source";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Fail(cmd, Status::Unavailable("cannot create " + dir + ": " + ec.message()));
  std::mt19937_64 rng(static_cast<uint64_t>(cfg.seed));
  std::mutex lose_mu;
  std::set<std::string> executed;
  auto provider = StartProvider(dir + "/provider.db", 16, [&](const std::string& key) {
    std::lock_guard lock(lose_mu);
    if (!executed.insert(key).second) return false;  // only a key's first execution
    return static_cast<double>(rng() % 1'000'000) / 1e6 < cfg.lost_response_rate;
  });
  if (!provider.ok()) return Fail(cmd, provider.status());
  const std::string store_url = g_store_url.empty() ? "sqlite:" + dir + "/payments.db" : g_store_url;
  auto store = OpenStore(store_url, true, cfg.consumers + 2);
  if (!store.ok()) return Fail(cmd, store.status());
  {
    auto tx = (*store)->Begin();
    if (!tx.ok()) return Fail(cmd, tx.status());
    for (const std::string& sql :
         {std::string("DROP TABLE IF EXISTS demo_payments"), CreatePaymentsSql("demo_payments")})
      if (auto r = (*tx)->Exec(sql); !r.ok()) return Fail(cmd, r.status());
    if (Status st = (*tx)->Commit(); !st.ok()) return Fail(cmd, st);
    if (auto p = (*store)->Purge(kConsumer, INT64_MAX, 10000); !p.ok()) return Fail(cmd, p.status());
  }
  SourceSettings settings{.lease_ms = cfg.lease_ms, .consumer = "idem-demo"};
  auto first = OpenSource(source_url, settings);
  if (!first.ok()) return Fail(cmd, first.status());
  say("idem demo on " + first->kind + " (" + RedactedSource(source_url) + "), store " + std::string((*store)->Kind()) +
      ", the provider over HTTP on " + (*provider)->url());

  // The producer: every message once, some twice (a producer retry).
  const std::string run = std::to_string(Env::Default()->NowMs());
  int64_t published = 0, expected = 0;
  for (int i = 0; i < cfg.messages; ++i) {
    const int64_t cents = 100 + static_cast<int64_t>(rng() % 100'000);
    Message m = PaymentMessage("pay-" + run + "-" + std::to_string(i), "o" + std::to_string(i), cents);
    expected += cents;
    const int copies = static_cast<double>(rng() % 1'000'000) / 1e6 < cfg.dup_rate ? 2 : 1;
    for (int k = 0; k < copies; ++k) {
      if (Status st = first->publish(m); !st.ok()) return Fail(cmd, st.WithContext("publish"));
      ++published;
    }
  }
  say("  published " + std::to_string(published) + " deliveries of " + std::to_string(cfg.messages) + " messages");

  std::atomic<int64_t> calls{0}, retries{0};
  const std::string provider_url = (*provider)->url();
  Handler charge = [&](Transaction& tx, const Message& m) -> Status {
    thread_local std::unique_ptr<http::Client> client;
    thread_local std::string client_for;
    if (!client || client_for != provider_url) {
      IDEM_ASSIGN_OR_RETURN(client, ProviderClient(provider_url));
      client_for = provider_url;
    }
    IDEM_ASSIGN_OR_RETURN(ChargeReply reply, Charge(*client, m));
    calls.fetch_add(reply.attempts);
    retries.fetch_add(reply.attempts - 1);
    return InsertPayment(tx, m, reply.charge_id);
  };
  auto inbox_owned = Inbox::Open(**store, Inbox::Options{.consumer = kConsumer});
  if (!inbox_owned.ok()) return Fail(cmd, inbox_owned.status());
  Inbox& inbox = **inbox_owned;
  int64_t lost_acks = 0;
  {
    DropAcks lossy(*first->source, cfg.lost_ack_rate, static_cast<uint64_t>(cfg.seed) + 1);
    auto consumer_owned =
        Consumer::Open(lossy, inbox, charge,
                       Consumer::Options{.workers = cfg.consumers, .receive_wait_ms = 1'000, .stop_when_idle = true});
    if (!consumer_owned.ok()) return Fail(cmd, consumer_owned.status());
    Consumer& consumer = **consumer_owned;
    if (Status st = consumer.Run(); !st.ok()) return Fail(cmd, st);
    lost_acks = lossy.dropped();
  }
  say("  consumer 1: " + std::to_string(inbox.counters().applied) + " applied, " +
      std::to_string(inbox.counters().duplicates) + " duplicates skipped, " + std::to_string(lost_acks) +
      " acks lost; it leaves");
  first->source.reset();  // closes the connection / leaves the group: unacked messages go back
  auto second = OpenSource(source_url, settings);
  if (!second.ok()) return Fail(cmd, second.status());
  const InboxCounters before = inbox.counters();
  {
    // Long enough for leases to run out and a group to rebalance.
    auto consumer_owned =
        Consumer::Open(*second->source, inbox, charge,
                       Consumer::Options{.workers = cfg.consumers,
                                         .receive_wait_ms = std::max<int64_t>(4 * cfg.lease_ms, 6'000),
                                         .stop_when_idle = true});
    if (!consumer_owned.ok()) return Fail(cmd, consumer_owned.status());
    Consumer& consumer = **consumer_owned;
    if (Status st = consumer.Run(); !st.ok()) return Fail(cmd, st);
  }
  const InboxCounters after = inbox.counters();
  say("  consumer 2 took over: " + std::to_string(after.applied - before.applied) + " applied, " +
      std::to_string(after.duplicates - before.duplicates) + " redelivered duplicates skipped");
  auto totals = ProviderCharges(dir + "/provider.db");
  if (!totals.ok()) return Fail(cmd, totals.status());
  Result<Totals> rows = PaymentsFor(**store, "");
  if (!rows.ok()) return Fail(cmd, rows.status());
  const bool ok = totals->charges == cfg.messages && totals->cents == expected && rows->rows == cfg.messages;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (cfg.json) {
    std::cout << Json()
                     .Add("source", first->kind)
                     .Add("messages", static_cast<int64_t>(cfg.messages))
                     .Add("published", published)
                     .Add("lost_acks", lost_acks)
                     .Add("applied", after.applied)
                     .Add("duplicates", after.duplicates)
                     .Add("provider_calls", calls.load())
                     .Add("provider_retries", retries.load())
                     .Add("charges", totals->charges)
                     .Add("payment_rows", rows->rows)
                     .Add("charged_cents", totals->cents)
                     .Add("expected_cents", expected)
                     .Add("ok", ok)
                     .str()
              << "\n";
  } else {
    say("  provider calls " + std::to_string(calls.load()) + " (" + std::to_string(retries.load()) +
        " retries with the same key after lost responses)");
    say("  charges made (provider's database)  " + std::to_string(totals->charges) + "  " +
        Mark(totals->charges == cfg.messages));
    say("  payment rows                         " + std::to_string(rows->rows) + "  " +
        Mark(rows->rows == cfg.messages));
    say("  total charged " + Dollars(totals->cents) + ", expected " + Dollars(expected) + "  " +
        Mark(totals->cents == expected));
    char t[32];
    std::snprintf(t, sizeof t, "%.1f s", secs);
    say(std::string("  time ") + t);
    say(ok ? "OK: every message charged exactly once" : "MISMATCH: see above");
  }
  return ok ? kExitOk : kExitCheckFailed;
}

}  // namespace

const Command& DemoCommand() {
  static const Command c{
      "demo",
      "Tell the idempotent consumer's story by doing it on SQLite and the embedded queue:\n"
      "no guard (charged twice), the guard (marker + charge in one transaction), redelivery and a race,\n"
      "a call over HTTP to a payment provider on loopback with an idempotency key (its response lost, the\n"
      "retry answered from the provider's store), crashes between separate writes, then a larger run with\n"
      "competing consumer processes, lost acks, lease expiries, producer duplicates and lost provider\n"
      "responses. Exits 1 if the totals differ from the expected ones.",
      "[--dir DIR] [--store URL] [--source URL] [--messages N] [--consumers C] [--web HOST:PORT [--pace DURATION]]\n"
      "       [--json]",
      {{"dir", "DIR", "", "work directory (default: a fresh temporary directory)"},
       {"source", "URL", "",
        "run on a broker instead: redis://...?stream=S, amqp://...?queue=Q, kafka://...?topic=T,\n"
        "          or kafka-mock: (librdkafka's mock cluster in this process); see idem run --help"},
       {"store", "URL", "", "the store: postgres://... (default: a SQLite file per step in DIR)"},
       {"messages", "N", "10000", "unique payment messages in the larger run"},
       {"consumers", "C", "4", "competing consumer processes"},
       {"lease-ms", "MS", "500", "the queue's lease (visibility timeout)"},
       {"dup-rate", "P", "0.05", "fraction of messages the producer publishes twice"},
       {"lost-ack-rate", "P", "0.03", "fraction of acks lost"},
       {"stall-rate", "P", "0.002", "fraction of receives that stall past the lease"},
       {"lost-response-rate", "P", "0.02", "fraction of charges whose HTTP response the provider drops"},
       {"seed", "S", "1", "random seed of the larger run"},
       {"skip-story", "", "", "only the larger run"},
       {"web", "HOST:PORT", "",
        "serve the live view: the story at --pace, then the larger run live; it stays up\n"
        "          after the run until SIGINT/SIGTERM"},
       {"pace", "DURATION", "1500ms", "with --web: how long each line of the story stays before the next"},
       {"json", "", "", "print one JSON object instead of the story"}}};
  return c;
}

int RunDemo(const Args& args) {
  Config cfg;
  auto num = [&](const char* name, auto& out) -> Status {
    auto v = args.GetInt(name);
    if (!v.ok()) return v.status();
    out = static_cast<std::remove_reference_t<decltype(out)>>(*v);
    return Status::OK();
  };
  // A finite number from 0 to 1, nothing else: "nan" (which fails every
  // comparison), "inf", "0.5x" and "" are refused.
  auto rate = [&](const char* name, double& out) -> Status {
    IDEM_ASSIGN_OR_RETURN(out, args.GetDouble(name, 0, 1));
    return Status::OK();
  };
  int64_t consumers = cfg.consumers;
  for (const Status& s :
       {num("messages", cfg.messages), num("consumers", consumers), num("lease-ms", cfg.lease_ms),
        num("seed", cfg.seed), rate("dup-rate", cfg.dup_rate), rate("lost-ack-rate", cfg.lost_ack_rate),
        rate("stall-rate", cfg.stall_rate), rate("lost-response-rate", cfg.lost_response_rate)})
    if (!s.ok()) return Fail("demo", s);
  if (cfg.messages < 1) return Fail("demo", Status::InvalidArgument("--messages must be at least 1"));
  // (Checked before it narrows to an int: 4294967297 is not 1.)
  if (consumers < 1 || consumers > 64) return Fail("demo", Status::InvalidArgument("--consumers must be from 1 to 64"));
  cfg.consumers = static_cast<int>(consumers);
  if (cfg.lease_ms < 50) return Fail("demo", Status::InvalidArgument("--lease-ms must be at least 50"));
  cfg.json = args.Bool("json");
  g_store_url = args.Get("store");
  cfg.story = !args.Bool("skip-story");
  if (args.Has("dir")) {
    cfg.dir = args.Get("dir");
    struct stat st {};
    if (::stat(cfg.dir.c_str(), &st) != 0) {
      std::error_code ec;
      std::filesystem::create_directories(cfg.dir, ec);
      if (ec) return Fail("demo", Status::Unavailable("cannot create --dir " + cfg.dir + ": " + ec.message()));
    } else if (!S_ISDIR(st.st_mode)) {
      return Fail("demo", Status::InvalidArgument("--dir " + cfg.dir + " is not a directory"));
    }
  } else {
    std::error_code ec;
    std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
    if (ec) tmp = "/tmp";
    std::string tmpl = (tmp / "idem-demo-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr)
      return Fail("demo", Status::Unavailable("cannot create a temporary directory"));
    cfg.dir = tmpl;
  }
  Out say{cfg.json};
  // --web: the live view, fed by this process and (over a socket in DIR) by
  // the consumer processes; /metrics counts the same events.
  std::unique_ptr<live::Feed> feed;
  std::unique_ptr<live::WebServer> web;
  Metrics registry;
  if (args.Has("web")) {
    auto pace = ParseDurationMs(args.Get("pace"));
    if (!pace.ok()) return Fail("demo", pace.status());
    if (*pace < 0) return Fail("demo", Status::InvalidArgument("--pace must not be negative"));
    feed = std::make_unique<live::Feed>("idem demo");
    feed->Forward(&registry);
    auto w = live::WebServer::Start("web", args.Get("web"), feed.get(), [&registry] { return registry.Render(); });
    if (!w.ok()) return Fail("demo", w.status());
    web = std::move(*w);
    g_live.socket = cfg.dir + "/live.sock";
    if (Status s = feed->Listen(g_live.socket); !s.ok()) return Fail("demo", s);
    g_live.feed = feed.get();
    g_live.pace_ms = *pace;
    std::cerr << "live view: " << web->url() << " (the story at one line per " << *pace
              << " ms, then the larger run)\n";
  }
  if (args.Has("source") && args.Get("source").rfind("embedded:", 0) != 0)
    return RunDemoOnSource(cfg, args.Get("source"), say);
  Json story;
  bool story_ok = true;
  if (cfg.story) {
    say("idem demo: the idempotent consumer, on SQLite, the embedded queue and a payment provider over HTTP");
    say("(files in " + cfg.dir + ")");
    say("");
    say("Step 1 · Without the guard, a lost ack means a second charge");
    auto s1 = StepWithoutGuard(cfg.dir, say);
    if (!s1.ok()) return Fail("demo", s1.status());
    say("");
    say("Step 2 · With the guard: the marker and the charge commit in one transaction");
    auto s2 = StepWithGuard(cfg.dir, say);
    if (!s2.ok()) return Fail("demo", s2.status());
    say("");
    say("Step 4 · Beyond the database: the call to the provider (HTTP) carries an idempotency key");
    auto s4 = StepProvider(cfg.dir, say);
    if (!s4.ok()) return Fail("demo", s4.status());
    say("");
    say("Why the marker and the work share one transaction (a child process is SIGKILLed at a kill point,");
    say("then the message is redelivered to a fresh consumer once its lease expires)");
    struct Sc {
      const char* name;
      Strategy s;
      const char* kp;
      const char* what;
    } scenarios[] = {
        {"id-first", Strategy::kIdFirst, "demo.between_writes", "ID saved first, charge second; crash between"},
        {"work-first", Strategy::kWorkFirst, "demo.between_writes", "charge saved first, ID second; crash between"},
        {"one-tx-before-commit", Strategy::kOneTransaction, "inbox.after_work",
         "one transaction; crash after both writes, before COMMIT"},
        {"one-tx-before-ack", Strategy::kOneTransaction, "inbox.after_commit",
         "one transaction; crash after COMMIT, before the ack"},
    };
    std::vector<std::string> crashes;
    for (const Sc& sc : scenarios) {
      auto r = CrashScenario(cfg.dir, sc.name, sc.s, sc.kp);
      if (!r.ok()) return Fail("demo", r.status());
      bool good = r->rows == 1;
      story_ok &= sc.s == Strategy::kOneTransaction ? good : !good;  // the naive ones must show their failure
      std::string verdict = r->rows == 0 ? "charge lost" : r->rows == 1 ? "charged once" : "charged twice";
      say("  " + std::string(sc.what) + std::string(58 - std::min<size_t>(57, std::string(sc.what).size()), ' ') +
          "-> " + std::to_string(r->rows) + " charge(s)  " + Mark(good) + " " + verdict);
      crashes.push_back(Json().Add("scenario", sc.name).Add("kill_point", sc.kp).Add("charges", r->rows).str());
    }
    story_ok &= s1->cents == 8000 && s2->order_1042.rows == 1 && s2->order_1043.rows == 1 && s4->charges == 1 &&
                s4->rows == 1 && s4->calls == 2 && s4->replayed && s4->stored_id == s4->charge_id;
    story.Add("no_guard_charged_cents", s1->cents)
        .Add("guard_charged_cents", s2->order_1042.cents)
        .Add("race_rows", s2->order_1043.rows)
        .Add("race_outcomes", s2->race_a + " / " + s2->race_b)
        .Add("provider_calls", s4->calls)
        .Add("provider_charges", s4->charges)
        .Add("provider_attempts", s4->attempts)
        .Add("provider_replayed", s4->replayed)
        .AddRaw("crashes", JsonArray(crashes));
    say("");
  }
  say("The larger run: " + std::to_string(cfg.messages) + " payment messages, " + std::to_string(cfg.consumers) +
      " competing consumer processes, injected faults (seed " + std::to_string(cfg.seed) + ")");
  auto run = LargerRun(cfg, say);
  if (!run.ok()) return Fail("demo", run.status());
  bool ok = run->ok && story_ok;
  if (cfg.json) {
    Json j = run->json;
    if (cfg.story) j.AddRaw("story", story.str()).Add("story_ok", story_ok);
    j.Add("ok", ok);
    std::cout << j.str() << "\n";
  }
  if (web) {
    say(ok ? "The demo is done: every total as expected." : "The demo is done: a total differs (see above).");
    std::cerr << "live view: " << web->url() << " stays up until SIGINT/SIGTERM\n";
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);
    int sig = 0;
    sigwait(&stop, &sig);
    g_live.feed = nullptr;
  }
  return ok ? kExitOk : kExitCheckFailed;
}

}  // namespace idem::cli
