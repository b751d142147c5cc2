// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem demo, the story: step 1 without the guard (charged twice), steps 2
// and 3 with it (redelivery and a race change nothing), step 4 the call to
// the provider over HTTP with its key, then why the marker and the work
// share one transaction (child processes SIGKILLed at kill points).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/kill_point.h"
#include "demo/demo.h"
#include "idem/http/client.h"
#include "idem/inbox.h"
#include "idem/testing/kill_points.h"
#include "payments.h"

namespace idem::cli::demo {
namespace {

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

// Why the marker and the work share one transaction: each way of writing
// them crashed between the two (the naive ones must show their failure).
// One JSON object per scenario is added to `crashes`.
Result<bool> CrashStory(const Config& cfg, const Out& say, std::vector<std::string>& crashes) {
  bool story_ok = true;
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
  for (const Sc& sc : scenarios) {
    auto r = CrashScenario(cfg.dir, sc.name, sc.s, sc.kp);
    if (!r.ok()) return r.status();
    bool good = r->rows == 1;
    story_ok &= sc.s == Strategy::kOneTransaction ? good : !good;  // the naive ones must show their failure
    std::string verdict = r->rows == 0 ? "charge lost" : r->rows == 1 ? "charged once" : "charged twice";
    say("  " + std::string(sc.what) + std::string(58 - std::min<size_t>(57, std::string(sc.what).size()), ' ') + "-> " +
        std::to_string(r->rows) + " charge(s)  " + Mark(good) + " " + verdict);
    crashes.push_back(Json().Add("scenario", sc.name).Add("kill_point", sc.kp).Add("charges", r->rows).str());
  }
  return story_ok;
}

}  // namespace

Result<bool> RunStory(const Config& cfg, const Out& say, Json& story) {
  bool story_ok = true;
  say("idem demo: the idempotent consumer, on SQLite, the embedded queue and a payment provider over HTTP");
  say("(files in " + cfg.dir + ")");
  say("");
  say("Step 1 · Without the guard, a lost ack means a second charge");
  auto s1 = StepWithoutGuard(cfg.dir, say);
  if (!s1.ok()) return s1.status();
  say("");
  say("Step 2 · With the guard: the marker and the charge commit in one transaction");
  auto s2 = StepWithGuard(cfg.dir, say);
  if (!s2.ok()) return s2.status();
  say("");
  say("Step 4 · Beyond the database: the call to the provider (HTTP) carries an idempotency key");
  auto s4 = StepProvider(cfg.dir, say);
  if (!s4.ok()) return s4.status();
  say("");
  std::vector<std::string> crashes;
  IDEM_ASSIGN_OR_RETURN(bool crashes_ok, CrashStory(cfg, say, crashes));
  story_ok &= crashes_ok;
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
  return story_ok;
}

}  // namespace idem::cli::demo
