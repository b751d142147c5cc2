// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem demo, the larger run: competing consumer processes charge over HTTP
// while acks, leases and provider responses are lost; a relay killed
// mid-batch moves "order paid" to the shipping queue; then every total is
// read back from the databases and checked.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "demo/demo.h"
#include "idem/consumer.h"
#include "idem/http/client.h"
#include "idem/inbox.h"
#include "idem/open.h"
#include "idem/outbox.h"
#include "idem/outbox_relay.h"
#include "idem/testing/kill_points.h"
#include "idem/url.h"
#include "live/feed.h"
#include "payments.h"
#include "sources.h"

namespace idem::cli::demo {
namespace {

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

// What the producer published: every message once, a share twice.
struct Workload {
  int64_t published = 0, expected_cents = 0;
};

// Publishes the run's payment messages (seeded), then the producer's
// retries: the same facts published a second time.
Result<Workload> PublishWorkload(const Config& cfg, const Files& f) {
  std::mt19937_64 rng(cfg.seed);
  Workload w;
  IDEM_ASSIGN_OR_RETURN(Parts p, OpenParts(f, cfg.lease_ms, true));
  std::vector<Message> again;
  Progress progress("publishing", cfg.messages);
  for (int64_t i = 0; i < cfg.messages; ++i) {
    char id[40];
    std::snprintf(id, sizeof id, "pay-%08llx-%06lld", static_cast<unsigned long long>(rng() & 0xffffffff),
                  static_cast<long long>(i));
    int64_t cents = 100 + static_cast<int64_t>(rng() % 99'900);
    Message m = PaymentMessage(id, std::to_string(100000 + i), cents);
    w.expected_cents += cents;
    IDEM_RETURN_IF_ERROR(p.queue->Publish(m));
    ++w.published;
    if (std::uniform_real_distribution<double>(0, 1)(rng) < cfg.dup_rate) again.push_back(m);
    progress.Update(i + 1);
  }
  progress.Done();
  for (const Message& m : again) {
    IDEM_RETURN_IF_ERROR(p.queue->Publish(m));
    ++w.published;
  }
  return w;
}

// The consumer processes' run: the provider they called, its lost
// responses, and how many of them failed.
struct Consumed {
  Result<std::unique_ptr<ProviderServer>> provider = Status::Unavailable("fork failed");
  std::shared_ptr<LossInjector> loss;
  int failed_children = 0;
};

// Waits for the consumer processes `pids`, showing the queue's progress.
int WaitForConsumers(const Config& cfg, const Files& f, const std::vector<pid_t>& pids, int64_t published) {
  int failed_children = 0;
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
  return failed_children;
}

// Forks the consumer processes, then starts the provider and tells them its
// port, and waits until they have emptied the queue.
Consumed ConsumeInProcesses(const Config& cfg, const Files& f, int64_t published) {
  Consumed c;
  std::cout.flush();
  // The children are forked before the provider's server threads start (a
  // child of a threaded process could inherit a lock some thread holds);
  // each waits for the provider's port on a pipe.
  int port_pipe[2];
  if (::pipe(port_pipe) != 0) {
    c.provider = Status::Unavailable("pipe failed");
    return c;
  }
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
  c.loss = loss;
  if (pids.size() == static_cast<size_t>(cfg.consumers))
    c.provider = StartProvider(f.provider, cfg.consumers + 8, [loss](const std::string& key) { return (*loss)(key); });
  if (c.provider.ok()) {
    const int port = (*c.provider)->port();
    for (size_t i = 0; i < pids.size(); ++i)
      if (::write(port_pipe[1], &port, sizeof port) != static_cast<ssize_t>(sizeof port)) break;
  }
  ::close(port_pipe[1]);  // without a provider, the children end at once
  c.failed_children = WaitForConsumers(cfg, f, pids, published);
  return c;
}

// Everything the larger run's check reads back.
struct Observed {
  Workload work;
  Stats sum;  // the consumer processes' counters, added up
  int failed_children = 0;
  int64_t lost_responses = 0, calls = 0, replays = 0;
  std::string provider_url;
  ProviderTotals charges;
  ShippingResult ship;
  Totals pay;
  int64_t markers = 0, dead_letters = 0, queue_left = 0;
  double seconds = 0;
};

// Reads back the payments store and queue after both stages.
Status ReadBack(const Config& cfg, const Files& f, Observed& o) {
  IDEM_ASSIGN_OR_RETURN(Parts p, OpenParts(f, cfg.lease_ms));
  IDEM_ASSIGN_OR_RETURN(o.pay, PaymentsFor(*p.store, ""));
  IDEM_ASSIGN_OR_RETURN(auto qs, p.queue->Stats());
  IDEM_ASSIGN_OR_RETURN(o.markers, p.store->CountMarkers(kConsumer));
  IDEM_ASSIGN_OR_RETURN(auto dead, p.store->ListDeadLetters(kConsumer, 1000));
  o.dead_letters = static_cast<int64_t>(dead.size());
  o.queue_left = qs.ready + qs.leased + qs.delayed;
  return Status::OK();
}

bool ShippedOnce(const Config& cfg, const ShippingResult& ship) {
  return ship.relay_killed && ship.relayed >= cfg.messages && ship.shipments == cfg.messages &&
         ship.orders == cfg.messages && ship.outbox_left == 0 && ship.queue_left == 0;
}

bool Passed(const Config& cfg, const Observed& o) {
  const int64_t expected = o.work.expected_cents;
  return o.failed_children == 0 && o.pay.rows == cfg.messages && o.pay.cents == expected &&
         o.charges.charges == cfg.messages && o.charges.keys == cfg.messages && o.charges.cents == expected &&
         o.markers == cfg.messages && o.queue_left == 0 && o.dead_letters == 0 && ShippedOnce(cfg, o.ship);
}

Json ToJson(const Config& cfg, Observed& o) {
  Json j;
  j.Add("messages", cfg.messages)
      .Add("published", o.work.published)
      .Add("producer_duplicates", o.work.published - cfg.messages)
      .Add("consumers", cfg.consumers)
      .Add("deliveries", o.sum["deliveries"])
      .Add("duplicates_skipped", o.sum["duplicates"])
      .Add("lost_acks", o.sum["lost_acks"])
      .Add("lease_expiries", o.sum["stalls"])
      .Add("lost_provider_responses", o.lost_responses)
      .Add("provider_retries", o.sum["provider_retries"])
      .Add("provider_replays", o.replays)
      .Add("provider_errors", o.sum["provider_errors"])
      .Add("handler_failures", o.sum["failures"])
      .Add("provider_calls", o.calls)
      .Add("charges", o.charges.charges)
      .Add("payment_rows", o.pay.rows)
      .Add("markers", o.markers)
      .Add("dead_letters", o.dead_letters)
      .Add("queue_left", o.queue_left)
      .Add("charged_cents", o.charges.cents)
      .Add("expected_cents", o.work.expected_cents)
      .Add("relay_killed", o.ship.relay_killed)
      .Add("relayed", o.ship.relayed)
      .Add("relay_republished", o.ship.republished)
      .Add("outbox_left", o.ship.outbox_left)
      .Add("shipping_deliveries", o.ship.deliveries)
      .Add("shipping_lost_acks", o.ship.lost_acks)
      .Add("shipping_duplicates_skipped", o.ship.duplicates)
      .Add("shipments", o.ship.shipments)
      .Add("shipping_queue_left", o.ship.queue_left)
      .Add("seconds", o.seconds)
      .Add("seed", static_cast<int64_t>(cfg.seed))
      .Add("provider", o.provider_url)
      .Add("dir", cfg.dir);
  return j;
}

// The table of the larger run, and where to look at what it stored.
void PrintTable(const Config& cfg, const Files& f, Observed& o, bool ok, const Out& say) {
  if (o.failed_children > 0) say("  " + std::to_string(o.failed_children) + " consumer process(es) failed");
  say("");
  auto row = [&](const std::string& k, const std::string& v) {
    say("  " + k + std::string(k.size() < 38 ? 38 - k.size() : 1, ' ') + v);
  };
  const int64_t expected = o.work.expected_cents;
  row("messages (unique)", std::to_string(cfg.messages));
  row("published (with producer retries)", std::to_string(o.work.published));
  row("deliveries", std::to_string(o.sum["deliveries"]));
  row("lost acks (injected)", std::to_string(o.sum["lost_acks"]));
  row("lease expiries (stalled consumers)", std::to_string(o.sum["stalls"]));
  row("duplicates skipped by the marker", std::to_string(o.sum["duplicates"]));
  row("lost provider responses (injected)", std::to_string(o.lost_responses));
  row("client retries with the same key", std::to_string(o.sum["provider_retries"]));
  row("responses replayed by the provider", std::to_string(o.replays));
  row("provider calls (POST /charges)", std::to_string(o.calls));
  row("charges made (provider's database)",
      std::to_string(o.charges.charges) + "  " +
          Mark(o.charges.charges == cfg.messages && o.charges.keys == cfg.messages));
  row("payment rows", std::to_string(o.pay.rows) + "  " + Mark(o.pay.rows == cfg.messages));
  row("total charged", Dollars(o.charges.cents));
  row("expected", Dollars(expected) + "  " + Mark(o.charges.cents == expected && o.pay.cents == expected));
  row("left in the queue / dead letters", std::to_string(o.queue_left) + " / " + std::to_string(o.dead_letters));
  say("  second stage: each payment added \"order paid\" to the outbox in its transaction; a relay");
  say("  published them to the shipping queue and was SIGKILLed after the broker took a batch, before");
  say("  recording it; a second relay published that batch again; the shipping consumer applied them");
  const ShippingResult& ship = o.ship;
  row("relayed to the shipping queue",
      std::to_string(ship.relayed) + " (" + std::to_string(ship.republished) + " republished, same ids)");
  row("shipping deliveries", std::to_string(ship.deliveries) + " (" + std::to_string(ship.lost_acks) + " acks lost)");
  row("duplicates skipped by shipping's inbox", std::to_string(ship.duplicates));
  row("shipments", std::to_string(ship.shipments) + "  " + Mark(ShippedOnce(cfg, ship)));
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f s", o.seconds);
  row("time", secs);
  say(ok ? "  OK: every message charged exactly once, every order shipped once" : "  FAILED: the totals differ");
  say("  see what is stored: idem inspect --store '" + RedactUrl(f.store) + "' --consumer " + kConsumer +
      " --queue 'embedded:" + f.queue + "?queue=payments'");
  say("  and the provider's idempotency records: idem inspect --store 'sqlite:" + f.provider + "'");
}

}  // namespace

Result<RunResult> LargerRun(const Config& cfg, const Out& say) {
  IDEM_ASSIGN_OR_RETURN(Files f, MakeFiles(cfg.dir, "run"));
  for (const char* name : {"queue.db", "payments.db", "provider.db", "shipping.db"})
    IDEM_RETURN_IF_ERROR(RemoveDbFiles(f.dir + "/" + name));
  auto started = std::chrono::steady_clock::now();
  Observed o;
  IDEM_ASSIGN_OR_RETURN(o.work, PublishWorkload(cfg, f));
  say("  published " + std::to_string(cfg.messages) + " payment messages plus " +
      std::to_string(o.work.published - cfg.messages) + " producer duplicates; starting " +
      std::to_string(cfg.consumers) + " consumer processes");
  Consumed c = ConsumeInProcesses(cfg, f, o.work.published);
  if (!c.provider.ok()) return c.provider.status();
  ProviderServer& provider = **c.provider;
  o.failed_children = c.failed_children;
  for (int i = 0; i < cfg.consumers; ++i)
    for (const auto& [k, v] : ReadStats(f.dir + "/consumer-" + std::to_string(i) + ".stats")) o.sum[k] += v;
  o.provider_url = provider.url();
  o.calls = ProviderCalls(provider);
  o.replays = static_cast<int64_t>(provider.counters().replayed);
  o.lost_responses = c.loss->lost();
  provider.Stop();
  IDEM_ASSIGN_OR_RETURN(o.charges, ProviderCharges(f.provider));
  IDEM_ASSIGN_OR_RETURN(o.ship, ShippingStage(cfg, f));
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  IDEM_RETURN_IF_ERROR(ReadBack(cfg, f, o));
  RunResult r;
  r.ok = Passed(cfg, o);
  r.json = ToJson(cfg, o);
  PrintTable(cfg, f, o, r.ok, say);
  return r;
}

}  // namespace idem::cli::demo
