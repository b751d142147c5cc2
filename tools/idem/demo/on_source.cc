// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem demo --source URL: the larger run on a broker, with a second consumer
// taking over what the first left unacknowledged.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
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

}  // namespace idem::cli::demo
