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

}  // namespace

int RunBenchCallFirst(const Args& args) {
  const std::string cmd = "bench call-first";
  const bool json = args.Bool("json");
  auto n = args.Has("messages") ? args.GetInt("messages", 1, 10'000'000) : Result<int64_t>(400);
  auto delay = args.GetInt("provider-delay-ms", 0, 60'000);
  auto rounds = args.GetInt("rounds", 1, 1000);
  for (const auto* r : {&n, &delay, &rounds})
    if (!r->ok()) return Fail(cmd, r->status());
  auto workers = ParseWorkersList(args.Get("workers-list"));
  if (!workers.ok()) return Fail(cmd, workers.status());
  std::vector<std::string> forms;
  if (const std::string f = args.Get("forms"); f == "both") {
    forms = {kForms[0], kForms[1]};
  } else if (f == kForms[0] || f == kForms[1]) {
    forms = {f};
  } else {
    return Fail(cmd, Status::InvalidArgument("--forms must be both, call-first or in-transaction, not '" + f + "'"));
  }
  const int max_workers = *std::max_element(workers->begin(), workers->end());

  // --- the store, and where the queue, the provider (and on SQLite the
  // in-transaction form's claims) live: a work directory beside the store
  // (PostgreSQL: under $TMPDIR), removed at the end.
  const std::string url = args.Get("store");
  const bool pg = IsPostgresScheme(url);
  std::string store_path;
  if (!pg) {
    auto o = sqlite::Store::ParseUrl(url);
    if (!o.ok()) return Fail(cmd, o.status());
    store_path = o->path;
  }
  std::string base;
  if (pg) {
    const char* tmp = std::getenv("TMPDIR");
    base = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
  } else {
    base = std::filesystem::path(store_path).parent_path().string();
    if (base.empty()) base = ".";
  }
  const std::string work = base + "/idem-bench-call-first." + std::to_string(::getpid());
  std::error_code ec;
  std::filesystem::create_directories(work, ec);
  if (ec) return Fail(cmd, Status::Unavailable("cannot create " + work + ": " + ec.message()));
  struct RemoveAtEnd {
    std::string dir;
    ~RemoveAtEnd() {
      std::error_code e;
      std::filesystem::remove_all(dir, e);
    }
  } remove_at_end{work};

  auto store_or = OpenStore(url, true, 2 * max_workers + 2);
  if (!store_or.ok()) return Fail(cmd, store_or.status());
  Store& store = **store_or;
  {
    auto tx = store.Begin();
    if (!tx.ok()) return Fail(cmd, tx.status());
    for (const std::string& sql : {std::string("DROP TABLE IF EXISTS ") + kTable, CreatePaymentsSql(kTable)})
      if (auto r = (*tx)->Exec(sql); !r.ok()) return Fail(cmd, r.status());
    if (Status s = (*tx)->Commit(); !s.ok()) return Fail(cmd, s);
  }
  if (store.claim_store() == nullptr) return Fail(cmd, Status::InvalidArgument("the store keeps no claims"));
  auto same_store_claims_owned = Claims::Open(*store.claim_store(), Claims::Options{.retention_ms = 3'600'000});
  if (!same_store_claims_owned.ok()) return Fail(cmd, same_store_claims_owned.status());
  Claims& same_store_claims = **same_store_claims_owned;
  // The in-transaction form's claims: on SQLite a file of their own (the
  // Inbox refuses CallOnce on its own file inside its transaction).
  std::unique_ptr<Store> claims_file;
  Claims* tx_claims = &same_store_claims;
  std::unique_ptr<Claims> own_claims;
  if (!pg && std::find(forms.begin(), forms.end(), kForms[1]) != forms.end()) {
    auto c = OpenStore("sqlite:" + work + "/claims.db", true, max_workers + 1);
    if (!c.ok()) return Fail(cmd, c.status());
    claims_file = std::move(*c);
    auto opened = Claims::Open(*claims_file->claim_store(), Claims::Options{.retention_ms = 3'600'000});
    if (!opened.ok()) return Fail(cmd, opened.status());
    own_claims = std::move(*opened);
    tx_claims = own_claims.get();
  }

  // --- the provider
  const int64_t total_messages = *n * *rounds * static_cast<int64_t>(workers->size() * forms.size());
  const std::string provider_db = work + "/provider.db";
  ProviderServerOptions po;
  po.store_url = "sqlite:" + provider_db + "?synchronous=normal";
  po.api_keys = {{kApiKey, kPrincipal}};
  po.idempotency.max_keys_per_principal = std::max<int64_t>(100'000, 2 * total_messages);
  po.charge_delay_ms = *delay;
  po.threads = std::max(32, 4 * max_workers);
  auto provider = ProviderServer::Start(std::move(po));
  if (!provider.ok()) return Fail(cmd, provider.status().WithContext("provider"));
  // One client per worker thread (a Client keeps one keep-alive connection
  // and is not shared between threads).
  ThreadClients clients((*provider)->url(), 8);

  // The disk's durable-commit ceiling in this run: every message costs
  // several commits on SQLite files (the queue's receive and ack, the
  // claim, its completion, the marker with the row), which serialise per
  // file whatever the worker count.
  auto fsync_per_s = MeasureFsync(work, 1.0);
  if (!fsync_per_s.ok()) return Fail(cmd, fsync_per_s.status());

  const std::string run = std::to_string(Env::Default()->NowMs());
  std::map<std::string, FormResult> results;
  std::vector<std::string> check_errors;
  int64_t applied_total = 0;
  Progress progress("rounds", *rounds * static_cast<int64_t>(workers->size() * forms.size()));
  int64_t done = 0;
  for (int64_t round = 0; round < *rounds; ++round) {
    for (const std::string& form : forms) {
      for (int w : *workers) {
        const std::string tag = form.substr(0, 2) + "-w" + std::to_string(w) + "-r" + std::to_string(round) + "-" + run;
        // Published before the clock starts: each message twice, as a
        // producer that retries publishes it.
        auto q = embedded::Queue::Open({.path = work + "/queue.db", .queue = tag, .poll_ms = 2});
        if (!q.ok()) return Fail(cmd, q.status());
        for (int copy = 0; copy < 2; ++copy)
          for (int64_t i = 0; i < *n; ++i) {
            const std::string order = tag + "-" + std::to_string(i);
            if (Status s = (*q)->Publish(PaymentMessage("m-" + order, order, 100 + i % 9'900)); !s.ok())
              return Fail(cmd, s);
          }
        auto inbox_owned = Inbox::Open(store, Inbox::Options{.consumer = "bench-" + tag});
        if (!inbox_owned.ok()) return Fail(cmd, inbox_owned.status());
        Inbox& inbox = **inbox_owned;
        auto call = [&](const Message& m) {
          return [&clients, &m](const std::string& key) -> Result<std::string> {
            IDEM_ASSIGN_OR_RETURN(http::Client * client, clients.Get());
            return PostCharge(*client, m, key);
          };
        };
        const Consumer::Options co{.workers = w, .receive_wait_ms = 20, .stop_when_idle = true};
        Result<std::unique_ptr<Consumer>> consumer = Status::Internal("no consumer");
        if (form == kForms[0]) {
          consumer = Consumer::Open(
              **q, inbox,
              CallFirst(
                  same_store_claims,
                  [&](Calls& calls, const Message& m) -> Status { return calls.Once("charge", call(m)).status(); },
                  [](Transaction& tx, const Message& m, const Calls& calls) -> Status {
                    return InsertPayment(tx, m, calls.at("charge"), kTable);
                  }),
              co);
        } else {
          consumer = Consumer::Open(
              **q, inbox,
              [&](Transaction& tx, const Message& m) -> Status {
                IDEM_ASSIGN_OR_RETURN(std::string charge, CallOnce(*tx_claims, m, "charge", call(m)));
                return InsertPayment(tx, m, charge, kTable);
              },
              co);
        }
        const auto t0 = std::chrono::steady_clock::now();
        if (!consumer.ok()) return Fail(cmd, consumer.status().WithContext(tag));
        if (Status s = (*consumer)->Run(); !s.ok()) return Fail(cmd, s.WithContext(tag));
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        results[form].rates[w].push_back(static_cast<double>(*n) / secs);
        const InboxCounters c = inbox.counters();
        const ConsumerStats cs = (*consumer)->stats();
        auto rows = CountRows(
            store, std::string("SELECT count(*) FROM ") + kTable + " WHERE substr(order_id, 1, length($1)) = $1",
            {tag + "-"});
        if (!rows.ok()) return Fail(cmd, rows.status());
        if (static_cast<int64_t>(c.applied) != *n || *rows != *n || cs.dead_lettered != 0)
          check_errors.push_back(tag + ": applied " + std::to_string(c.applied) + ", " + std::to_string(*rows) +
                                 " rows, " + std::to_string(cs.dead_lettered) + " dead-lettered, for " +
                                 std::to_string(*n) + " messages");
        applied_total += static_cast<int64_t>(c.applied);
        if (!json)
          std::fprintf(
              stderr,
              "  round %lld %-14s %2d worker(s): %8.1f messages/s (%.2f s; %llu duplicates, %llu in progress)\n",
              static_cast<long long>(round) + 1, form.c_str(), w, static_cast<double>(*n) / secs, secs,
              static_cast<unsigned long long>(c.duplicates), static_cast<unsigned long long>(cs.in_progress));
        progress.Update(++done);
      }
    }
  }
  progress.Done();
  (*provider)->Stop();

  // --- the checks across the run: one row per message, one charge per order.
  auto rows = CountRows(store, std::string("SELECT count(*) FROM ") + kTable);
  auto distinct = CountRows(store, std::string("SELECT count(DISTINCT message_id) FROM ") + kTable);
  auto charges = ProviderCharges(provider_db);
  if (!rows.ok()) return Fail(cmd, rows.status());
  if (!distinct.ok()) return Fail(cmd, distinct.status());
  if (!charges.ok()) return Fail(cmd, charges.status());
  if (*rows != total_messages || *distinct != total_messages || applied_total != total_messages)
    check_errors.push_back(std::to_string(*rows) + " payment rows (" + std::to_string(*distinct) + " messages) for " +
                           std::to_string(total_messages) + " messages");
  if (charges->charges != total_messages || charges->keys != total_messages)
    check_errors.push_back("the provider made " + std::to_string(charges->charges) + " charges under " +
                           std::to_string(charges->keys) + " keys for " + std::to_string(total_messages) + " orders");
  {
    // Every charge under its own order (customer cus_<order>).
    auto db = sqlite::Store::Open({.path = provider_db});
    if (!db.ok()) return Fail(cmd, db.status());
    auto orders = CountRows(**db, "SELECT count(DISTINCT customer) FROM provider_charges");
    if (!orders.ok()) return Fail(cmd, orders.status());
    if (*orders != total_messages)
      check_errors.push_back("the provider charged " + std::to_string(*orders) + " distinct orders of " +
                             std::to_string(total_messages));
  }
  const bool ok = check_errors.empty();

  // --- the report
  const int w0 = workers->front();
  auto ratios_of = [&](const FormResult& fr, int w) {
    std::vector<double> out;
    const auto& base_rates = fr.rates.at(w0);
    const auto& rates = fr.rates.at(w);
    for (size_t r = 0; r < rates.size(); ++r) out.push_back(rates[r] / base_rates[r]);
    return out;
  };
  const std::string kind(store.Kind());
  const std::string where = pg ? RedactUrl(url) : store_path;
  if (json) {
    Json j;
    j.Add("bench", "call-first")
        .Add("store", kind)
        .Add("path", where)
        .Add("messages", *n)
        .Add("deliveries_per_round", 2 * *n)
        .Add("provider_delay_ms", *delay)
        .Add("provider", "idem provider (ProviderServer, two-phase) in-process on 127.0.0.1")
        .Add("rounds", *rounds)
        .Add("fsync_per_s", *fsync_per_s);
    std::vector<std::string> ws;
    for (int w : *workers) ws.push_back(std::to_string(w));
    j.AddRaw("workers_list", JsonArray(ws));
    for (const std::string& form : forms) {
      const FormResult& fr = results[form];
      Json f;
      for (int w : *workers) {
        Json one;
        std::vector<std::string> rates, ratios;
        for (double r : fr.rates.at(w)) rates.push_back(Number(r));
        for (double r : ratios_of(fr, w)) ratios.push_back(Number(r));
        one.AddRaw("per_s", JsonArray(rates))
            .Add("median_per_s", Median(fr.rates.at(w)))
            .AddRaw("ratio", JsonArray(ratios))
            .Add("median_ratio", Median(ratios_of(fr, w)));
        f.AddRaw(std::to_string(w), one.str());
      }
      j.AddRaw(form, f.str());
    }
    j.Add("payment_rows", *rows).Add("provider_charges", charges->charges).Add("ok", ok);
    std::cout << j.str() << "\n";
  } else {
    std::printf(
        "idem bench call-first: %s (%s), provider delay %lld ms per charge (idem provider in-process), "
        "%lld messages per round (each published twice), %lld round(s)\n",
        where.c_str(), kind.c_str(), static_cast<long long>(*delay), static_cast<long long>(*n),
        static_cast<long long>(*rounds));
    std::printf("  disk: %.0f fdatasync/s (4 KiB, in the work directory %s)\n", *fsync_per_s, work.c_str());
    for (const std::string& form : forms) {
      const FormResult& fr = results[form];
      std::printf("  %s%s\n", form.c_str(),
                  form == kForms[0] ? " (calls before the transaction; claims in the store)"
                                    : (pg ? " (CallOnce inside the transaction; claims in the store)"
                                          : " (CallOnce inside the transaction; claims in a file of their own)"));
      for (int w : *workers) {
        std::printf("    %2d worker(s): messages/s", w);
        for (double r : fr.rates.at(w)) std::printf(" %8.1f", r);
        std::printf("   median %8.1f", Median(fr.rates.at(w)));
        if (w != w0) {
          std::printf("   ratio to %d:", w0);
          for (double r : ratios_of(fr, w)) std::printf(" %.2fx", r);
          std::printf("   median %.2fx", Median(ratios_of(fr, w)));
        }
        std::printf("\n");
      }
    }
    std::printf("  checks: %lld payment rows for %lld messages, %lld charges at the provider: %s\n",
                static_cast<long long>(*rows), static_cast<long long>(total_messages),
                static_cast<long long>(charges->charges), ok ? "ok" : "FAILED");
  }
  std::fflush(stdout);
  if (!ok) {
    for (const auto& e : check_errors) std::fprintf(stderr, "CORRECTNESS CHECK FAILED: %s\n", e.c_str());
    return kExitCheckFailed;
  }
  return kExitOk;
}

}  // namespace idem::cli
