// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "chaos/worker.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>

#include "chaos/clock.h"
#include "chaos/journal.h"
#include "chaos/relay.h"
#include "cli.h"
#include "idem/consumer.h"
#include "idem/inbox.h"
#if IDEM_HAVE_KAFKA
#include "idem/kafka/offset_inbox.h"
#endif
#include "core/kill_point.h"
#include "idem/outbox.h"
#include "idem/testing/fault_vfs.h"
#include "payments.h"
#include "sources.h"

namespace idem::cli::chaos {
namespace {

// A broken worker's stop: SIGTERM or SIGINT.
std::atomic<bool> g_stop{false};

// SIGTERM or SIGINT stop a worker that runs its own loop.
void StopOnSigterm() {
  struct sigaction sa {};
  sa.sa_handler = [](int) { g_stop = true; };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

// The effect rows of message `id`, read in a transaction of their own.
Result<int64_t> EffectRows(Store& store, const std::string& id) {
  IDEM_ASSIGN_OR_RETURN(std::vector<PaymentRow> rows, ReadPayments(store, kTable, id));
  return static_cast<int64_t>(rows.size());
}

// The mistakes the pattern exists to prevent, made on purpose (--broken):
// the run must then report lost or duplicated effects.
int BrokenWorker(const Config& cfg, Source& source, Store& store, Inbox& inbox, const Handler& handler) {
  StopOnSigterm();
  while (!g_stop) {
    auto got = source.Receive(1, 100);
    if (!got.ok()) continue;
    for (const Delivery& d : *got) {
      if (cfg.broken == "no-guard") {
        // The effect alone, then the ack: a redelivery applies it again.
        auto tx = store.Begin();
        if (!tx.ok() || !handler(**tx, d.message).ok() || !(*tx)->Commit().ok()) {
          (void)source.Nack(d, 10);
          continue;
        }
        (void)source.Ack(d);
      } else if (cfg.broken == "unfenced") {
        // The guard read on its own (the effect row is the marker here),
        // then the effect written by a transaction that does not look again.
        // A redelivery after the commit finds the row (kills, lost acks:
        // right); two holders at once both pass the read (wrong): a holder
        // paused between the two, past its lease, commits after the one that
        // took the delivery over.
        auto applied = EffectRows(store, d.message.id);
        if (!applied.ok()) {
          (void)source.Nack(d, 10);
          continue;
        }
        if (*applied > 0) {
          (void)source.Ack(d);
          continue;
        }
        IDEM_KILL_POINT("chaos.unfenced_after_check");
        auto tx = store.Begin();
        if (!tx.ok() || !handler(**tx, d.message).ok() || !(*tx)->Commit().ok()) {
          (void)source.Nack(d, 10);
          continue;
        }
        (void)source.Ack(d);
      } else {
        // Acknowledged first: a crash before the commit loses the message.
        (void)source.Ack(d);
        (void)inbox.Handle(d.message, handler);
      }
    }
  }
  return kExitOk;
}

#if IDEM_HAVE_KAFKA
// Kafka's offset mode: kafka::OffsetInbox on one record at a time, in order
// per partition (a failed record nacked: the source seeks back to it).
int OffsetWorker(Source& source, Store& store, const Handler& handler, const std::string& name) {
  auto oi = kafka::OffsetInbox::Open(store, {.consumer = kConsumer});
  if (!oi.ok()) {
    std::cerr << "chaos consumer " << name << ": " << oi.status() << "\n";
    return kExitError;
  }
  StopOnSigterm();
  while (!g_stop) {
    auto got = source.Receive(1, 100);
    if (!got.ok()) continue;
    for (const Delivery& d : *got) {
      Outcome o = (*oi)->Handle(d, handler);
      if (o.ShouldAck()) {
        (void)source.Ack(d);
      } else {
        (void)source.Nack(d, 20);
      }
    }
  }
  return kExitOk;
}
#endif

// Stage 2's effect: one row per message applied, in the order applied (n),
// with the outbox's id, ordering key and seq and the stage-1 message it was
// caused by.
Status InsertShipment(Transaction& tx, const Message& m) {
  auto header = [&m](std::string_view name) { return std::string(m.Header(name).value_or("")); };
  const std::string seq = header(kOutboxSeqHeader);
  return tx
      .Exec(std::string("INSERT INTO ") + kStage2Table +
                "(n, outbox_id, key, seq, causation_id) VALUES ((SELECT coalesce(max(n), 0) + 1 FROM " + kStage2Table +
                "), $1, $2, $3, $4)",
            {m.id, header(kOrderingKeyHeader), static_cast<int64_t>(std::strtoll(seq.c_str(), nullptr, 10)),
             header(kCausationIdHeader)})
      .status();
}

}  // namespace

std::string CreateShipmentsSql() {
  return std::string("CREATE TABLE IF NOT EXISTS ") + kStage2Table +
         "(n BIGINT NOT NULL, outbox_id TEXT NOT NULL, key TEXT NOT NULL, seq BIGINT NOT NULL, causation_id TEXT "
         "NOT NULL)";
}

int RunWorker(const Config& cfg) {
  if (cfg.role == Role::kRelay) return RunRelay(cfg);
  const bool stage2 = cfg.role == Role::kStage2;
  const std::string name = std::to_string(cfg.slot) + "-" + std::to_string(cfg.life);
  Journal journal(JournalPath(cfg.dir, cfg.role, cfg.slot, cfg.life));
  if (!journal.ok()) {
    std::cerr << "chaos consumer " << name << ": cannot open its journal in " << cfg.dir << "\n";
    return kExitError;
  }
  // A life given clock jumps reads its time through the supervisor's offset.
  std::unique_ptr<ShiftedClock> clock;
  if (!cfg.clock_file.empty()) {
    auto started =
        ShiftedClock::Start(cfg.clock_file, [&journal](int64_t offset) { journal.Line('C', std::to_string(offset)); });
    if (!started.ok()) {
      std::cerr << "chaos consumer " << name << ": " << started.status() << "\n";
      return kExitError;
    }
    clock = std::move(*started);
  }
  auto opened = OpenSource(
      cfg.source, {.lease_ms = cfg.lease_ms, .consumer = "chaos-" + std::to_string(cfg.slot), .env = clock.get()});
  if (!opened.ok()) {
    std::cerr << "chaos consumer " << name << ": " << opened.status() << "\n";
    return kExitError;
  }
  auto store = OpenStore(cfg.store, true, 2);
  if (!store.ok()) {
    std::cerr << "chaos consumer " << name << ": " << store.status() << "\n";
    return kExitError;
  }
  // Faults the fault VFS fired in this life, journalled as they happen (a
  // kill may lose the last one: the count is a lower bound).
  std::atomic<bool> done{false};
  std::thread fault_watch;
  if (std::getenv(sqlite::FaultVfs::kEnvVar) != nullptr) {
    fault_watch = std::thread([&journal, &done] {
      auto vfs = sqlite::FaultVfs::Install();
      int64_t seen = 0;
      while (vfs.ok() && !done) {
        for (int64_t n = (*vfs)->counters().faults; seen < n; ++seen) journal.Line('F', std::to_string(seen + 1));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  struct JoinAtEnd {
    std::atomic<bool>& done;
    std::thread& t;
    ~JoinAtEnd() {
      done = true;
      if (t.joinable()) t.join();
    }
  } join_at_end{done, fault_watch};
  FaultySource source(*opened->source,
                      cfg.seed * 7919 + static_cast<uint64_t>(cfg.slot) * 131 + static_cast<uint64_t>(cfg.life),
                      cfg.lost_ack_rate, cfg.stall_rate, cfg.lease_ms + 200);
  source.on_event = [&journal, stage2](char e, const Delivery& d) {
    journal.Line(e, d.message.id);
    // Stage 2's first deliveries, whose order per key the check reads.
    if (stage2 && e == 'R' && d.message.attempt == 1) journal.Line('D', d.message.id);
  };
  ThreadClients clients(cfg.provider, kClientAttempts, kClientReadTimeoutMs);
  auto inbox_owned =
      Inbox::Open(**store, Inbox::Options{.consumer = stage2 ? kStage2Consumer : kConsumer, .env = clock.get()});
  if (!inbox_owned.ok()) {
    std::cerr << "chaos consumer " << name << ": " << inbox_owned.status() << "\n";
    return kExitError;
  }
  Inbox& inbox = **inbox_owned;
  // The two-stage pipeline's stage 1 adds one message per payment to the
  // outbox, in the handler's transaction: the order's key, caused by the
  // payment.
  std::unique_ptr<Outbox> outbox;
  if (TwoStage(cfg) && !stage2) {
    auto opened_outbox = Outbox::Open(**store);
    if (!opened_outbox.ok()) {
      std::cerr << "chaos consumer " << name << ": " << opened_outbox.status() << "\n";
      return kExitError;
    }
    outbox = std::move(*opened_outbox);
  }
  Handler handler = [&](Transaction& tx, const Message& m) -> Status {
    journal.Line('H', m.id);
    if (stage2) return InsertShipment(tx, m);
    IDEM_ASSIGN_OR_RETURN(http::Client * client, clients.Get());
    auto c = Charge(*client, m);
    // The client gave up (409s while the provider holds the key, 5xx,
    // connection errors): the charge may have been made and is not
    // finished, so the message is in progress -- redelivered, no failure
    // counted -- not failed. Counted, it would be dead-lettered (lost) once
    // the provider's lease outlasts the consumer's retry budget.
    if (!c.ok() && c.status().code() == Code::kUnavailable) return Status::InDoubt(c.status().message());
    if (!c.ok()) return c.status();
    IDEM_RETURN_IF_ERROR(InsertPayment(tx, m, c->charge_id, kTable));
    if (outbox == nullptr) return Status::OK();
    IDEM_ASSIGN_OR_RETURN(auto payment, ParsePayment(m));
    OutgoingMessage out{.key = OrderKey(cfg, payment.first), .payload = "shipping:" + m.id};
    return outbox->Add(tx, out.CausedBy(m)).status();
  };
#if IDEM_HAVE_KAFKA
  if (OffsetMode(cfg)) return OffsetWorker(source, **store, handler, name);
#endif
  if (!cfg.broken.empty() && cfg.broken != kBrokenRelay && !stage2)
    return BrokenWorker(cfg, source, **store, inbox, handler);
  Consumer::Options options = ChaosConsumerOptions(cfg);
  options.env = clock.get();
  auto consumer_owned = Consumer::Open(source, inbox, handler, options);
  if (!consumer_owned.ok()) {
    std::cerr << "chaos consumer " << name << ": " << consumer_owned.status() << "\n";
    return kExitError;
  }
  Consumer& consumer = **consumer_owned;
  StopOnSignals(&consumer);
  Status s = consumer.Run();
  StopOnSignals(nullptr);
  if (!s.ok()) {
    std::cerr << "chaos consumer " << name << ": " << s << "\n";
    return kExitError;
  }
  return kExitOk;
}

}  // namespace idem::cli::chaos
