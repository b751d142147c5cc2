// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem demo --source URL: the larger run on a broker, with a second consumer
// taking over what the first left unacknowledged.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <mutex>
#include <random>
#include <set>
#include <string>

#include "demo/demo.h"
#include "idem/consumer.h"
#include "idem/env.h"
#include "idem/http/client.h"
#include "idem/inbox.h"
#include "idem/open.h"
#include "idem/url.h"
#include "payments.h"
#include "sources.h"

namespace idem::cli::demo {
namespace {

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

// The payments table emptied and the consumer's markers purged: what an
// earlier run left in a shared store.
Status ResetRun(Store& store) {
  IDEM_RETURN_IF_ERROR(ResetPayments(store, "demo_payments"));
  return store.Purge(kConsumer, INT64_MAX, 10000).status();
}

// The producer: every message once, some twice (a producer retry).
struct Produced {
  int64_t published = 0, expected_cents = 0;
};

Result<Produced> PublishPayments(const Config& cfg, const std::function<Status(const Message&)>& publish,
                                 std::mt19937_64& rng) {
  const std::string run = std::to_string(Env::Default()->NowMs());
  Produced p;
  for (int i = 0; i < cfg.messages; ++i) {
    const int64_t cents = 100 + static_cast<int64_t>(rng() % 100'000);
    Message m = PaymentMessage("pay-" + run + "-" + std::to_string(i), "o" + std::to_string(i), cents);
    p.expected_cents += cents;
    const int copies = static_cast<double>(rng() % 1'000'000) / 1e6 < cfg.dup_rate ? 2 : 1;
    for (int k = 0; k < copies; ++k) {
      IDEM_RETURN_IF_ERROR(publish(m).WithContext("publish"));
      ++p.published;
    }
  }
  return p;
}

// Runs a consumer of `source` until it is idle.
Status ConsumeUntilIdle(Source& source, Inbox& inbox, const Handler& charge, int workers, int64_t wait_ms) {
  IDEM_ASSIGN_OR_RETURN(
      auto consumer,
      Consumer::Open(source, inbox, charge,
                     Consumer::Options{.workers = workers, .receive_wait_ms = wait_ms, .stop_when_idle = true}));
  return consumer->Run();
}

// What the run found, read back from the provider's and the store's databases.
struct OnSourceResult {
  std::string kind;
  Produced produced;
  int64_t lost_acks = 0, calls = 0, retries = 0;
  InboxCounters after;
  ProviderTotals totals;
  Totals rows;
  double seconds = 0;
  bool ok = false;
};

void PrintOnSource(const Config& cfg, const OnSourceResult& r, const Out& say) {
  if (cfg.json) {
    std::cout << Json()
                     .Add("source", r.kind)
                     .Add("messages", static_cast<int64_t>(cfg.messages))
                     .Add("published", r.produced.published)
                     .Add("lost_acks", r.lost_acks)
                     .Add("applied", r.after.applied)
                     .Add("duplicates", r.after.duplicates)
                     .Add("provider_calls", r.calls)
                     .Add("provider_retries", r.retries)
                     .Add("charges", r.totals.charges)
                     .Add("payment_rows", r.rows.rows)
                     .Add("charged_cents", r.totals.cents)
                     .Add("expected_cents", r.produced.expected_cents)
                     .Add("ok", r.ok)
                     .str()
              << "\n";
    return;
  }
  say("  provider calls " + std::to_string(r.calls) + " (" + std::to_string(r.retries) +
      " retries with the same key after lost responses)");
  say("  charges made (provider's database)  " + std::to_string(r.totals.charges) + "  " +
      Mark(r.totals.charges == cfg.messages));
  say("  payment rows                         " + std::to_string(r.rows.rows) + "  " +
      Mark(r.rows.rows == cfg.messages));
  say("  total charged " + Dollars(r.totals.cents) + ", expected " + Dollars(r.produced.expected_cents) + "  " +
      Mark(r.totals.cents == r.produced.expected_cents));
  char t[32];
  std::snprintf(t, sizeof t, "%.1f s", r.seconds);
  say(std::string("  time ") + t);
  say(r.ok ? "OK: every message charged exactly once" : "MISMATCH: see above");
}

}  // namespace

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
  if (Status s = ResetRun(**store); !s.ok()) return Fail(cmd, s);
  SourceSettings settings{.lease_ms = cfg.lease_ms, .consumer = "idem-demo"};
  auto first = OpenSource(source_url, settings);
  if (!first.ok()) return Fail(cmd, first.status());
  say("idem demo on " + first->kind + " (" + RedactedSource(source_url) + "), store " + std::string((*store)->Kind()) +
      ", the provider over HTTP on " + (*provider)->url());
  OnSourceResult r;
  r.kind = first->kind;
  auto produced = PublishPayments(cfg, first->publish, rng);
  if (!produced.ok()) return Fail(cmd, produced.status());
  r.produced = *produced;
  say("  published " + std::to_string(r.produced.published) + " deliveries of " + std::to_string(cfg.messages) +
      " messages");

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
  {
    DropAcks lossy(*first->source, cfg.lost_ack_rate, static_cast<uint64_t>(cfg.seed) + 1);
    if (Status s = ConsumeUntilIdle(lossy, inbox, charge, cfg.consumers, 1'000); !s.ok()) return Fail(cmd, s);
    r.lost_acks = lossy.dropped();
  }
  say("  consumer 1: " + std::to_string(inbox.counters().applied) + " applied, " +
      std::to_string(inbox.counters().duplicates) + " duplicates skipped, " + std::to_string(r.lost_acks) +
      " acks lost; it leaves");
  first->source.reset();  // closes the connection / leaves the group: unacked messages go back
  auto second = OpenSource(source_url, settings);
  if (!second.ok()) return Fail(cmd, second.status());
  const InboxCounters before = inbox.counters();
  // Long enough for leases to run out and a group to rebalance.
  if (Status s =
          ConsumeUntilIdle(*second->source, inbox, charge, cfg.consumers, std::max<int64_t>(4 * cfg.lease_ms, 6'000));
      !s.ok())
    return Fail(cmd, s);
  r.after = inbox.counters();
  say("  consumer 2 took over: " + std::to_string(r.after.applied - before.applied) + " applied, " +
      std::to_string(r.after.duplicates - before.duplicates) + " redelivered duplicates skipped");
  auto totals = ProviderCharges(dir + "/provider.db");
  if (!totals.ok()) return Fail(cmd, totals.status());
  Result<Totals> rows = PaymentsFor(**store, "");
  if (!rows.ok()) return Fail(cmd, rows.status());
  r.totals = *totals;
  r.rows = *rows;
  r.calls = calls.load();
  r.retries = retries.load();
  r.ok = r.totals.charges == cfg.messages && r.totals.cents == r.produced.expected_cents && r.rows.rows == cfg.messages;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  PrintOnSource(cfg, r, say);
  return r.ok ? kExitOk : kExitCheckFailed;
}

}  // namespace idem::cli::demo
