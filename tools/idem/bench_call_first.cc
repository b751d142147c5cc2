// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem bench call-first: a consumer whose handler calls a provider that takes
// --provider-delay-ms per charge, with W workers for each W of
// --workers-list, in one run. Two forms of the same handler, side by side:
//   call-first:      idem::CallFirst: calls.Once("charge", POST /charges)
//                    runs before the Inbox's transaction opens, then the
//                    payment row in that transaction; the claims in the
//                    store itself (on SQLite the inbox's own file).
//   in-transaction:  a plain Handler: CallOnce inside the Inbox's
//                    transaction; on SQLite the claims in a file of their
//                    own next to the store (the transaction holds the
//                    store file's write lock during the call).
// The provider is `idem provider`'s server (ProviderServer, two-phase
// Idempotency-Key handling) in this process on 127.0.0.1, with its charge
// delay. Each round publishes --messages fresh messages, each twice (the
// producer's retry), to an embedded queue and drains them with a Consumer;
// rounds alternate the worker counts and the forms, so the machine's noise
// reaches them all. Checks every message applied once (one row each) and the
// provider charged once per order; exit 1 if not.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "components.h"
#include "idem/call_first.h"
#include "idem/claims.h"
#include "idem/consumer.h"
#include "idem/embedded/queue.h"
#include "idem/inbox.h"
#include "idem/sqlite/store.h"
#include "idem/url.h"
#include "payments.h"
#include "provider_server.h"

namespace idem::cli {
namespace {

constexpr const char* kTable = "bench_call_first_payments";
constexpr const char* kForms[] = {"call-first", "in-transaction"};

Result<std::vector<int>> ParseWorkersList(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const std::optional<int64_t> n = ParseInteger(item);
    if (!n || *n < 1 || *n > 64)
      return Status::InvalidArgument("--workers-list must be worker counts 1..64 separated by commas, not '" + text +
                                     "'");
    out.push_back(static_cast<int>(*n));
  }
  if (out.empty()) return Status::InvalidArgument("--workers-list is empty");
  return out;
}

// The charge id from the provider's 201 answer.
Result<std::string> PostCharge(http::Client& client, const Message& m, const std::string& key) {
  IDEM_ASSIGN_OR_RETURN(auto pay, ParsePayment(m));
  IDEM_ASSIGN_OR_RETURN(http::Response r, client.Post("/charges", ChargeBody(pay.first, pay.second), key));
  if (r.status != 201)
    return Status::Internal("the provider answered " + std::to_string(r.status) + ": " + r.body.substr(0, 300));
  nlohmann::json j = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j["id"].is_string())
    return Status::Internal("the provider's answer has no charge id: " + r.body.substr(0, 300));
  return j["id"].get<std::string>();
}

Result<int64_t> CountRows(Store& store, const std::string& sql, std::vector<Value> params = {}) {
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  IDEM_ASSIGN_OR_RETURN(Rows r, tx->Query(sql, params));
  return r.rows[0][0].AsInt();
}

std::string Number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

struct FormResult {
  std::map<int, std::vector<double>> rates;  // workers -> messages/s per round
};

// The run's flags.
struct Settings {
  int64_t n = 0, delay = 0, rounds = 0;
  std::vector<int> workers;
  std::vector<std::string> forms;
  std::string url, store_path;  // store_path: SQLite's file
  bool pg = false, json = false;
  int max_workers() const { return *std::max_element(workers.begin(), workers.end()); }
  int64_t total_messages() const { return n * rounds * static_cast<int64_t>(workers.size() * forms.size()); }
};

Result<Settings> ParseSettings(const Args& args) {
  Settings st;
  st.json = args.Bool("json");
  IDEM_ASSIGN_OR_RETURN(st.n, args.Has("messages") ? args.GetInt("messages", 1, 10'000'000) : Result<int64_t>(400));
  IDEM_ASSIGN_OR_RETURN(st.delay, args.GetInt("provider-delay-ms", 0, 60'000));
  IDEM_ASSIGN_OR_RETURN(st.rounds, args.GetInt("rounds", 1, 1000));
  IDEM_ASSIGN_OR_RETURN(st.workers, ParseWorkersList(args.Get("workers-list")));
  if (const std::string f = args.Get("forms"); f == "both") {
    st.forms = {kForms[0], kForms[1]};
  } else if (f == kForms[0] || f == kForms[1]) {
    st.forms = {f};
  } else {
    return Status::InvalidArgument("--forms must be both, call-first or in-transaction, not '" + f + "'");
  }
  st.url = args.Get("store");
  st.pg = IsPostgresScheme(st.url);
  if (!st.pg) {
    IDEM_ASSIGN_OR_RETURN(auto o, sqlite::Store::ParseUrl(st.url));
    st.store_path = o.path;
  }
  return st;
}

// Where the queue, the provider (and on SQLite the in-transaction form's
// claims) live: a work directory beside the store (PostgreSQL: under
// $TMPDIR), removed at the end.
struct WorkDir {
  std::string path;
  WorkDir() = default;
  WorkDir(const WorkDir&) = delete;
  WorkDir& operator=(const WorkDir&) = delete;
  ~WorkDir() {
    if (path.empty()) return;
    std::error_code e;
    std::filesystem::remove_all(path, e);
  }
};

Status MakeWorkDir(const Settings& st, WorkDir& work) {
  std::string base;
  if (st.pg) {
    const char* tmp = std::getenv("TMPDIR");
    base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  } else {
    base = std::filesystem::path(st.store_path).parent_path().string();
    if (base.empty()) base = ".";
  }
  const std::string dir = base + "/idem-bench-call-first." + std::to_string(::getpid());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::Unavailable("cannot create " + dir + ": " + ec.message());
  work.path = dir;
  return Status::OK();
}

// The store with its payments table, and each form's claims.
struct Stores {
  std::unique_ptr<Store> store;
  std::unique_ptr<Claims> same_store_claims;
  // The in-transaction form's claims: on SQLite a file of their own (the
  // Inbox refuses CallOnce on its own file inside its transaction).
  std::unique_ptr<Store> claims_file;
  std::unique_ptr<Claims> own_claims;
  Claims* tx_claims = nullptr;
};

Status OpenStores(const Settings& st, const std::string& work, Stores& s) {
  IDEM_ASSIGN_OR_RETURN(s.store, OpenStore(st.url, true, 2 * st.max_workers() + 2));
  IDEM_RETURN_IF_ERROR(ResetPayments(*s.store, kTable));
  if (s.store->claim_store() == nullptr) return Status::InvalidArgument("the store keeps no claims");
  IDEM_ASSIGN_OR_RETURN(s.same_store_claims,
                        Claims::Open(*s.store->claim_store(), Claims::Options{.retention_ms = 3'600'000}));
  s.tx_claims = s.same_store_claims.get();
  if (!st.pg && std::find(st.forms.begin(), st.forms.end(), kForms[1]) != st.forms.end()) {
    IDEM_ASSIGN_OR_RETURN(s.claims_file, OpenStore("sqlite:" + work + "/claims.db", true, st.max_workers() + 1));
    IDEM_ASSIGN_OR_RETURN(s.own_claims,
                          Claims::Open(*s.claims_file->claim_store(), Claims::Options{.retention_ms = 3'600'000}));
    s.tx_claims = s.own_claims.get();
  }
  return Status::OK();
}

Result<std::unique_ptr<ProviderServer>> StartBenchProvider(const Settings& st, const std::string& provider_db) {
  ProviderServerOptions po;
  po.store_url = "sqlite:" + provider_db + "?synchronous=normal";
  po.api_keys = {{kApiKey, kPrincipal}};
  po.idempotency.max_keys_per_principal = std::max<int64_t>(100'000, 2 * st.total_messages());
  po.charge_delay_ms = st.delay;
  po.threads = std::max(32, 4 * st.max_workers());
  return ProviderServer::Start(std::move(po));
}

// What the rounds found.
struct Measured {
  std::map<std::string, FormResult> results;
  std::vector<std::string> check_errors;
  int64_t applied_total = 0;
};

// One round of one form with `w` workers on a queue of its own (`tag`):
// each message published twice before the clock starts, as a producer that
// retries publishes it; then consumed, timed and checked.
Status RunOne(const Settings& st, Stores& s, ThreadClients& clients, const std::string& work, const std::string& tag,
              const std::string& form, int w, int64_t round, Measured& m) {
  IDEM_ASSIGN_OR_RETURN(auto q, embedded::Queue::Open({.path = work + "/queue.db", .queue = tag, .poll_ms = 2}));
  for (int copy = 0; copy < 2; ++copy)
    for (int64_t i = 0; i < st.n; ++i) {
      const std::string order = tag + "-" + std::to_string(i);
      IDEM_RETURN_IF_ERROR(q->Publish(PaymentMessage("m-" + order, order, 100 + i % 9'900)));
    }
  IDEM_ASSIGN_OR_RETURN(auto inbox_owned, Inbox::Open(*s.store, Inbox::Options{.consumer = "bench-" + tag}));
  Inbox& inbox = *inbox_owned;
  auto call = [&](const Message& msg) {
    return [&clients, &msg](const std::string& key) -> Result<std::string> {
      IDEM_ASSIGN_OR_RETURN(http::Client * client, clients.Get());
      return PostCharge(*client, msg, key);
    };
  };
  const Consumer::Options co{.workers = w, .receive_wait_ms = 20, .stop_when_idle = true};
  Result<std::unique_ptr<Consumer>> consumer = Status::Internal("no consumer");
  if (form == kForms[0]) {
    consumer = Consumer::Open(
        *q, inbox,
        CallFirst(
            *s.same_store_claims,
            [&](Calls& calls, const Message& msg) -> Status { return calls.Once("charge", call(msg)).status(); },
            [](Transaction& tx, const Message& msg, const Calls& calls) -> Status {
              return InsertPayment(tx, msg, calls.at("charge"), kTable);
            }),
        co);
  } else {
    Claims* tx_claims = s.tx_claims;
    consumer = Consumer::Open(
        *q, inbox,
        [&, tx_claims](Transaction& tx, const Message& msg) -> Status {
          IDEM_ASSIGN_OR_RETURN(std::string charge, CallOnce(*tx_claims, msg, "charge", call(msg)));
          return InsertPayment(tx, msg, charge, kTable);
        },
        co);
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (!consumer.ok()) return consumer.status().WithContext(tag);
  IDEM_RETURN_IF_ERROR((*consumer)->Run().WithContext(tag));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.results[form].rates[w].push_back(static_cast<double>(st.n) / secs);
  const InboxCounters c = inbox.counters();
  const ConsumerStats cs = (*consumer)->stats();
  IDEM_ASSIGN_OR_RETURN(
      int64_t rows,
      CountRows(*s.store, std::string("SELECT count(*) FROM ") + kTable + " WHERE substr(order_id, 1, length($1)) = $1",
                {tag + "-"}));
  if (static_cast<int64_t>(c.applied) != st.n || rows != st.n || cs.dead_lettered != 0)
    m.check_errors.push_back(tag + ": applied " + std::to_string(c.applied) + ", " + std::to_string(rows) + " rows, " +
                             std::to_string(cs.dead_lettered) + " dead-lettered, for " + std::to_string(st.n) +
                             " messages");
  m.applied_total += static_cast<int64_t>(c.applied);
  if (!st.json)
    std::fprintf(stderr,
                 "  round %lld %-14s %2d worker(s): %8.1f messages/s (%.2f s; %llu duplicates, %llu in progress)\n",
                 static_cast<long long>(round) + 1, form.c_str(), w, static_cast<double>(st.n) / secs, secs,
                 static_cast<unsigned long long>(c.duplicates), static_cast<unsigned long long>(cs.in_progress));
  return Status::OK();
}

// Every round of every form and worker count.
Status RunRounds(const Settings& st, Stores& s, ThreadClients& clients, const std::string& work, Measured& m) {
  const std::string run = std::to_string(Env::Default()->NowMs());
  Progress progress("rounds", st.rounds * static_cast<int64_t>(st.workers.size() * st.forms.size()));
  int64_t done = 0;
  for (int64_t round = 0; round < st.rounds; ++round) {
    for (const std::string& form : st.forms) {
      for (int w : st.workers) {
        const std::string tag = form.substr(0, 2) + "-w" + std::to_string(w) + "-r" + std::to_string(round) + "-" + run;
        IDEM_RETURN_IF_ERROR(RunOne(st, s, clients, work, tag, form, w, round, m));
        progress.Update(++done);
      }
    }
  }
  progress.Done();
  return Status::OK();
}

// The run's totals, read back.
struct Totals {
  int64_t rows = 0;
  ProviderTotals charges;
};

// The checks across the run: one row per message, one charge per order.
Result<Totals> CheckRun(const Settings& st, Store& store, const std::string& provider_db, Measured& m) {
  const int64_t total = st.total_messages();
  Totals t;
  auto rows = CountRows(store, std::string("SELECT count(*) FROM ") + kTable);
  auto distinct = CountRows(store, std::string("SELECT count(DISTINCT message_id) FROM ") + kTable);
  auto charges = ProviderCharges(provider_db);
  IDEM_ASSIGN_OR_RETURN(t.rows, std::move(rows));
  IDEM_RETURN_IF_ERROR(distinct.status());
  IDEM_ASSIGN_OR_RETURN(t.charges, std::move(charges));
  if (t.rows != total || *distinct != total || m.applied_total != total)
    m.check_errors.push_back(std::to_string(t.rows) + " payment rows (" + std::to_string(*distinct) +
                             " messages) for " + std::to_string(total) + " messages");
  if (t.charges.charges != total || t.charges.keys != total)
    m.check_errors.push_back("the provider made " + std::to_string(t.charges.charges) + " charges under " +
                             std::to_string(t.charges.keys) + " keys for " + std::to_string(total) + " orders");
  // Every charge under its own order (customer cus_<order>).
  IDEM_ASSIGN_OR_RETURN(auto db, sqlite::Store::Open({.path = provider_db}));
  IDEM_ASSIGN_OR_RETURN(int64_t orders, CountRows(*db, "SELECT count(DISTINCT customer) FROM provider_charges"));
  if (orders != total)
    m.check_errors.push_back("the provider charged " + std::to_string(orders) + " distinct orders of " +
                             std::to_string(total));
  return t;
}

// Each round's rate over the first worker count's in the same round.
std::vector<double> RatiosOf(const Settings& st, const FormResult& fr, int w) {
  std::vector<double> out;
  const auto& base_rates = fr.rates.at(st.workers.front());
  const auto& rates = fr.rates.at(w);
  for (size_t r = 0; r < rates.size(); ++r) out.push_back(rates[r] / base_rates[r]);
  return out;
}

void PrintJson(const Settings& st, std::string_view kind, const std::string& where, double fsync_per_s, Measured& m,
               const Totals& t, bool ok) {
  Json j;
  j.Add("bench", "call-first")
      .Add("store", std::string(kind))
      .Add("path", where)
      .Add("messages", st.n)
      .Add("deliveries_per_round", 2 * st.n)
      .Add("provider_delay_ms", st.delay)
      .Add("provider", "idem provider (ProviderServer, two-phase) in-process on 127.0.0.1")
      .Add("rounds", st.rounds)
      .Add("fsync_per_s", fsync_per_s);
  std::vector<std::string> ws;
  for (int w : st.workers) ws.push_back(std::to_string(w));
  j.AddRaw("workers_list", JsonArray(ws));
  for (const std::string& form : st.forms) {
    const FormResult& fr = m.results[form];
    Json f;
    for (int w : st.workers) {
      Json one;
      std::vector<std::string> rates, ratios;
      for (double r : fr.rates.at(w)) rates.push_back(Number(r));
      for (double r : RatiosOf(st, fr, w)) ratios.push_back(Number(r));
      one.AddRaw("per_s", JsonArray(rates))
          .Add("median_per_s", Median(fr.rates.at(w)))
          .AddRaw("ratio", JsonArray(ratios))
          .Add("median_ratio", Median(RatiosOf(st, fr, w)));
      f.AddRaw(std::to_string(w), one.str());
    }
    j.AddRaw(form, f.str());
  }
  j.Add("payment_rows", t.rows).Add("provider_charges", t.charges.charges).Add("ok", ok);
  std::cout << j.str() << "\n";
}

void PrintText(const Settings& st, std::string_view kind, const std::string& where, double fsync_per_s,
               const std::string& work, Measured& m, const Totals& t, bool ok) {
  const std::string k(kind);
  std::printf(
      "idem bench call-first: %s (%s), provider delay %lld ms per charge (idem provider in-process), "
      "%lld messages per round (each published twice), %lld round(s)\n",
      where.c_str(), k.c_str(), static_cast<long long>(st.delay), static_cast<long long>(st.n),
      static_cast<long long>(st.rounds));
  std::printf("  disk: %.0f fdatasync/s (4 KiB, in the work directory %s)\n", fsync_per_s, work.c_str());
  const int w0 = st.workers.front();
  for (const std::string& form : st.forms) {
    const FormResult& fr = m.results[form];
    std::printf("  %s%s\n", form.c_str(),
                form == kForms[0] ? " (calls before the transaction; claims in the store)"
                                  : (st.pg ? " (CallOnce inside the transaction; claims in the store)"
                                           : " (CallOnce inside the transaction; claims in a file of their own)"));
    for (int w : st.workers) {
      std::printf("    %2d worker(s): messages/s", w);
      for (double r : fr.rates.at(w)) std::printf(" %8.1f", r);
      std::printf("   median %8.1f", Median(fr.rates.at(w)));
      if (w != w0) {
        std::printf("   ratio to %d:", w0);
        for (double r : RatiosOf(st, fr, w)) std::printf(" %.2fx", r);
        std::printf("   median %.2fx", Median(RatiosOf(st, fr, w)));
      }
      std::printf("\n");
    }
  }
  std::printf("  checks: %lld payment rows for %lld messages, %lld charges at the provider: %s\n",
              static_cast<long long>(t.rows), static_cast<long long>(st.total_messages()),
              static_cast<long long>(t.charges.charges), ok ? "ok" : "FAILED");
}

}  // namespace

int RunBenchCallFirst(const Args& args) {
  const std::string cmd = "bench call-first";
  auto settings = ParseSettings(args);
  if (!settings.ok()) return Fail(cmd, settings.status());
  const Settings& st = *settings;
  WorkDir work;
  if (Status s = MakeWorkDir(st, work); !s.ok()) return Fail(cmd, s);
  Stores stores;
  if (Status s = OpenStores(st, work.path, stores); !s.ok()) return Fail(cmd, s);
  const std::string provider_db = work.path + "/provider.db";
  auto provider = StartBenchProvider(st, provider_db);
  if (!provider.ok()) return Fail(cmd, provider.status().WithContext("provider"));
  // One client per worker thread (a Client keeps one keep-alive connection
  // and is not shared between threads).
  ThreadClients clients((*provider)->url(), 8);
  // The disk's durable-commit ceiling in this run: every message costs
  // several commits on SQLite files (the queue's receive and ack, the
  // claim, its completion, the marker with the row), which serialise per
  // file whatever the worker count.
  auto fsync_per_s = MeasureFsync(work.path, 1.0);
  if (!fsync_per_s.ok()) return Fail(cmd, fsync_per_s.status());
  Measured m;
  if (Status s = RunRounds(st, stores, clients, work.path, m); !s.ok()) return Fail(cmd, s);
  (*provider)->Stop();
  auto totals = CheckRun(st, *stores.store, provider_db, m);
  if (!totals.ok()) return Fail(cmd, totals.status());
  const bool ok = m.check_errors.empty();
  const std::string where = st.pg ? RedactUrl(st.url) : st.store_path;
  if (st.json) {
    PrintJson(st, stores.store->Kind(), where, *fsync_per_s, m, *totals, ok);
  } else {
    PrintText(st, stores.store->Kind(), where, *fsync_per_s, work.path, m, *totals, ok);
  }
  std::fflush(stdout);
  if (!ok) {
    for (const auto& e : m.check_errors) std::fprintf(stderr, "CORRECTNESS CHECK FAILED: %s\n", e.c_str());
    return kExitCheckFailed;
  }
  return kExitOk;
}

}  // namespace idem::cli
