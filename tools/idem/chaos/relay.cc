// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "chaos/relay.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chaos/journal.h"
#include "cli.h"
#include "core/kill_point.h"
#include "idem/open.h"
#include "idem/outbox_relay.h"
#include "idem/outbox_store.h"

namespace idem::cli::chaos {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<OutboxRelay*> g_relay{nullptr};

void OnSignal(int) {
  g_stop = true;
  if (OutboxRelay* r = g_relay.load()) r->Stop();
}

int64_t MonotonicNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The relay's publisher, journalling each hand-over and confirm.
class JournallingPublisher final : public Publisher {
 public:
  JournallingPublisher(Publisher& inner, Journal& journal) : inner_(inner), journal_(journal) {}
  Status Publish(const Message& message) override {
    const Outgoing one{inner_.Channel(), "", &message};
    return PublishBatch({&one, 1})[0];
  }
  std::vector<Status> PublishBatch(std::span<const Outgoing> batch) override {
    const std::string t = std::to_string(MonotonicNs());
    for (const Outgoing& o : batch) {
      const auto seq = o.message->Header(kOutboxSeqHeader);
      journal_.Line('P', o.message->id + " " + (o.key.empty() ? "-" : std::string(o.key)) + " " +
                             std::string(seq.value_or("0")) + " " + t);
    }
    std::vector<Status> answers = inner_.PublishBatch(batch);
    for (size_t i = 0; i < answers.size() && i < batch.size(); ++i)
      if (answers[i].ok()) journal_.Line('K', batch[i].message->id);
    return answers;
  }
  PublisherTraits traits() const override { return inner_.traits(); }
  std::string_view Channel() const override { return inner_.Channel(); }
  std::string_view Kind() const override { return inner_.Kind(); }

 private:
  Publisher& inner_;
  Journal& journal_;
};

// The broken relay: each fetched batch settled as sent, then published.
Status BrokenRelay(Store& store, Publisher& publisher, const std::string& name) {
  OutboxStore* outbox = store.outbox_store();
  if (outbox == nullptr) return Status::InvalidArgument("the store has no outbox");
  std::unique_ptr<OutboxSession> session;
  while (!g_stop) {
    if (session == nullptr || !session->Alive()) {
      auto opened = outbox->OpenSession(name);
      if (!opened.ok()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      session = std::move(*opened);
    }
    auto lanes = session->Rebalance();
    int64_t republished = 0;
    auto rows = lanes.ok() && *lanes > 0 ? session->Fetch(100, &republished)
                                         : Result<std::vector<OutboxRow>>(std::vector<OutboxRow>{});
    if (!rows.ok() || rows->empty()) {
      (void)session->Wait(100);
      continue;
    }
    OutboxSettlement settle;
    settle.now_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    for (const OutboxRow& r : *rows) settle.sent.push_back(r.seq);
    if (!session->Settle(settle).ok()) continue;
    // (The real relay's points, where this one is: settled, not published.)
    IDEM_KILL_POINT("relay.after_settle");
    IDEM_KILL_POINT("relay.before_publish");
    for (const OutboxRow& r : *rows) {
      Message m{.id = r.id, .producer_time_ms = r.producer_time_ms, .payload = r.payload, .headers = r.headers};
      m.headers.emplace_back(std::string(kOutboxSeqHeader), std::to_string(r.seq));
      const Outgoing o{r.destination, r.key, &m};
      (void)publisher.PublishBatch({&o, 1});
    }
    IDEM_KILL_POINT("relay.after_publish");
  }
  return Status::OK();
}

}  // namespace

int RunRelay(const Config& cfg) {
  const std::string name = std::to_string(cfg.slot) + "-" + std::to_string(cfg.life);
  Journal journal(JournalPath(cfg.dir, Role::kRelay, cfg.slot, cfg.life));
  auto fail = [&](const Status& s) {
    std::cerr << "chaos relay " << name << ": " << s << "\n";
    return kExitError;
  };
  if (!journal.ok()) return fail(Status::Unavailable("cannot open its journal in " + cfg.dir + "/relay"));
  auto store = OpenStore(cfg.store, true, 2);
  if (!store.ok()) return fail(store.status());
  auto inner = OpenPublisher(cfg.source);
  if (!inner.ok()) return fail(inner.status());
  JournallingPublisher publisher(**inner, journal);
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  if (cfg.broken == kBrokenRelay) {
    Status s = BrokenRelay(**store, publisher, "chaos-relay-" + std::to_string(cfg.slot));
    return s.ok() ? kExitOk : fail(s);
  }
  auto relay = OutboxRelay::Open(**store, publisher,
                                 {.name = "chaos-relay-" + std::to_string(cfg.slot),
                                  .batch = 100,
                                  .poll_ms = 100,
                                  .backoff_base_ms = 20,
                                  .backoff_max_ms = 200,
                                  .rebalance_ms = 200});
  if (!relay.ok()) return fail(relay.status());
  g_relay = relay->get();
  if (g_stop) (*relay)->Stop();
  Status s = (*relay)->Run();
  g_relay = nullptr;
  const OutboxRelayStats st = (*relay)->stats();
  journal.Line('T', std::to_string(st.published) + " " + std::to_string(st.republished));
  return s.ok() ? kExitOk : fail(s);
}

}  // namespace idem::cli::chaos
