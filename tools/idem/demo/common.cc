// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem demo: what every part uses (demo.h): the narrative, a step's files,
// queue and store, and the payment provider over HTTP.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <system_error>
#include <thread>

#include "demo/demo.h"
#include "idem/open.h"
#include "idem/outbox.h"
#include "payments.h"

namespace idem::cli::demo {

LiveDemo g_live;
std::string g_store_url;

namespace {

// The second stage's effect, one row per order paid (no unique key: a second
// application would show as a second row).
constexpr const char* kCreateShipments =
    "CREATE TABLE IF NOT EXISTS demo_shipments(order_id TEXT NOT NULL, message_id TEXT NOT NULL)";

constexpr const char* kCreateNaiveMarkers = "CREATE TABLE IF NOT EXISTS demo_processed(message_id TEXT PRIMARY KEY)";

}  // namespace

void Show(live::Note note) {
  if (note.consumer.empty()) note.consumer = kConsumer;
  if (g_live.feed != nullptr) g_live.feed->Tell(note);
}

void Out::operator()(const std::string& line) const {
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

Status RemoveDbFiles(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::error_code ec;
    std::filesystem::remove(path + suffix, ec);
    if (ec) return Status::IoError("cannot remove " + path + suffix + ": " + ec.message());
  }
  return Status::OK();
}

std::string Dollars(int64_t cents) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "$%lld.%02lld", static_cast<long long>(cents / 100),
                static_cast<long long>(cents % 100));
  std::string s = buf;
  if (s.size() > 3 && s.compare(s.size() - 3, 3, ".00") == 0) s.resize(s.size() - 3);
  return s;
}

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

Result<Parts> OpenParts(const Files& f, int64_t lease_ms, bool fresh) {
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
    IDEM_RETURN_IF_ERROR(tx->Commit());
    IDEM_RETURN_IF_ERROR(ForgetFailures(*p.store, kConsumer));
  }
  IDEM_ASSIGN_OR_RETURN(auto tx, p.store->Begin());
  IDEM_RETURN_IF_ERROR(tx->Exec(CreatePaymentsSql("demo_payments")).status());
  IDEM_RETURN_IF_ERROR(tx->Exec(kCreateNaiveMarkers).status());
  IDEM_RETURN_IF_ERROR(tx->Exec(kCreateShipments).status());
  IDEM_RETURN_IF_ERROR(tx->Commit());
  return p;
}

Result<Delivery> Next(Source& q, const char* who, int64_t wait_ms) {
  IDEM_ASSIGN_OR_RETURN(auto got, q.Receive(1, wait_ms));
  if (got.empty()) return Status::NotFound("no delivery within " + std::to_string(wait_ms) + " ms");
  const Message& m = got.front().message;
  Show({.kind = "received", .id = m.id, .attempt = m.attempt, .who = who});
  return std::move(got.front());
}

Result<Totals> PaymentsFor(Store& store, const std::string& order) {
  IDEM_ASSIGN_OR_RETURN(std::vector<PaymentRow> rows, ReadPayments(store, "demo_payments"));
  Totals t;
  for (const PaymentRow& row : rows) {
    if (!order.empty() && row.order_id != order) continue;
    ++t.rows;
    t.cents += row.cents;
  }
  return t;
}

std::string Mark(bool good) { return good ? "✓" : "✕"; }

Result<std::unique_ptr<ProviderServer>> StartProvider(const std::string& path, int threads,
                                                      std::function<bool(const std::string&)> lose_response,
                                                      std::function<void(const std::string&)> log) {
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

}  // namespace idem::cli::demo
