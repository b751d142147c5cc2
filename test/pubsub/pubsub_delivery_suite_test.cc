// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The delivery suite (util/delivery_suite.h, delivery_suite_test.cc) on
// idem::pubsub::Source, on the fixture's emulator: a plain subscription
// ("pubsub") and an exactly-once delivery subscription with a dead-letter
// policy ("pubsub_exactly_once").
//
// The suite moves time on a FakeEnv and checks leases to the millisecond;
// the emulator keeps its own clock, which a test cannot move. So here the
// leases run on the FakeEnv: the subscriptions' real deadline is 600 s (never
// reached in a test), and FakeLeases (below) keeps, for every delivery the
// test holds, when its lease (or nack delay) ends on the FakeEnv; when the
// suite moves the FakeEnv past it, the delivery is given back to the
// emulator by the Source's own Nack(delivery, 0) (modifyAckDeadline 0). What
// the suite checks is then the adapter's calls and the service's answers:
// redelivery, receipts, an ack id refused once it expired or was acked
// (kLeaseLost on the exactly-once subscription), attempts counted by the
// service (deliveryAttempt). The service's own deadlines, in real time, are
// pubsub_source_test.cc's (PubsubLeases.*).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "idem/pubsub/publisher.h"
#include "idem/pubsub/source.h"
#include "pubsub/pubsub_test_util.h"
#include "util/delivery_suite.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

constexpr int64_t kRealDeadlineMs = 600'000;

// The FakeEnv's leases of one test (see the file comment).
class FakeLeases {
 public:
  void Track(const std::string& ack_id, int64_t end_ms, pubsub::Source* expirer) {
    std::lock_guard l(mu_);
    ends_[ack_id] = {end_ms, expirer};
  }
  void Forget(const std::string& ack_id) {
    std::lock_guard l(mu_);
    ends_.erase(ack_id);
  }
  // Gives back to the emulator every delivery whose lease ended by `now`.
  void ExpireDue(int64_t now) {
    std::vector<std::pair<std::string, pubsub::Source*>> due;
    {
      std::lock_guard l(mu_);
      for (auto it = ends_.begin(); it != ends_.end();) {
        if (it->second.first <= now) {
          due.emplace_back(it->first, it->second.second);
          it = ends_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const auto& [id, expirer] : due) (void)expirer->Nack(Delivery{.receipt = id}, 0);
  }
  // The earliest lease end, if any.
  std::optional<int64_t> Next() {
    std::lock_guard l(mu_);
    std::optional<int64_t> out;
    for (const auto& [id, end] : ends_) out = out ? std::min(*out, end.first) : end.first;
    return out;
  }
  // A handle of the test's own per subscription, which gives deliveries back.
  Result<pubsub::Source*> Expirer(const pubsub::Source::Options& o) {
    std::lock_guard l(mu_);
    auto& e = expirers_[o.subscription];
    if (!e) {
      auto opened = pubsub::Source::Open(o);
      if (!opened.ok()) return opened.status();
      e = std::move(*opened);
    }
    return e.get();
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::pair<int64_t, pubsub::Source*>> ends_;  // ack id -> lease end, expirer
  std::map<std::string, std::unique_ptr<pubsub::Source>> expirers_;
};

// The FakeLeases of the running test, by its FakeEnv (the advance hook gets
// only the env).
std::mutex g_mu;
std::map<const Env*, std::weak_ptr<FakeLeases>> g_leases;

std::shared_ptr<FakeLeases> LeasesOf(const Env* env) {
  std::lock_guard l(g_mu);
  auto it = g_leases.find(env);
  return it == g_leases.end() ? nullptr : it->second.lock();
}

// The Source with its leases on the FakeEnv.
class OnFakeEnv final : public Source {
 public:
  OnFakeEnv(std::unique_ptr<pubsub::Source> inner, std::shared_ptr<FakeLeases> leases, pubsub::Source* expirer,
            FakeEnv* env, int64_t lease)
      : inner_(std::move(inner)), leases_(std::move(leases)), expirer_(expirer), env_(env), lease_(lease) {}

  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override {
    const int64_t deadline = env_->NowMs() + std::max<int64_t>(0, wait_ms);
    for (;;) {
      auto got = inner_->Receive(max, 0);
      if (!got.ok()) return got;
      for (const Delivery& d : *got) leases_->Track(d.receipt, env_->NowMs() + lease_, expirer_);
      if (!got->empty() || env_->NowMs() >= deadline) return got;
      // Wait on the FakeEnv: to the next lease end within the wait, or to
      // its end.
      const std::optional<int64_t> next = leases_->Next();
      const int64_t to = next && *next <= deadline ? std::max(*next, env_->NowMs()) : deadline;
      env_->Advance(to - env_->NowMs());
      leases_->ExpireDue(env_->NowMs());
    }
  }
  Status Ack(const Delivery& d) override {
    Status s = inner_->Ack(d);
    if (s.ok()) leases_->Forget(d.receipt);
    return s;
  }
  Status Nack(const Delivery& d, int64_t delay_ms) override {
    Status s = inner_->Nack(d, delay_ms);
    if (s.ok() && delay_ms <= 0) leases_->Forget(d.receipt);
    if (s.ok() && delay_ms > 0) leases_->Track(d.receipt, env_->NowMs() + delay_ms, expirer_);
    return s;
  }
  Status ExtendLease(const Delivery& d) override {
    Status s = inner_->ExtendLease(d);
    if (s.ok()) leases_->Track(d.receipt, env_->NowMs() + lease_, expirer_);
    return s;
  }
  int64_t lease_ms() const override { return lease_; }
  std::string_view Kind() const override { return inner_->Kind(); }

 private:
  std::unique_ptr<pubsub::Source> inner_;
  std::shared_ptr<FakeLeases> leases_;
  pubsub::Source* expirer_;
  FakeEnv* env_;
  int64_t lease_;
};

struct Flavour {
  bool exactly_once = false;
};

Result<SourceHandle> OpenOn(const TempDir& dir, const SourceConfig& c, Flavour f) {
  const std::string base = ServerNameFor(dir, "d") + (c.other_channel ? "-other" : "");
  pubsub::Source::Options so{.connection = PubsubConnection(),
                             .subscription = "s" + base,
                             .create = true,
                             .topic = "t" + base,
                             .lease_ms = kRealDeadlineMs,
                             .exactly_once = f.exactly_once};
  if (f.exactly_once) so.dead_letter_topic = "x" + base;
  auto s = pubsub::Source::Open(so);
  if (!s.ok()) return s.status();
  auto p = pubsub::Publisher::Open({.connection = PubsubConnection(), .topic = so.topic});
  if (!p.ok()) return p.status();
  std::shared_ptr<pubsub::Publisher> pub = std::move(*p);
  SourceHandle h;
  h.publish = [pub](const Message& m) { return pub->Publish(m); };
  h.publisher = pub;
  h.channel = so.topic;
  auto* fake = dynamic_cast<FakeEnv*>(c.env);
  if (fake == nullptr) {  // a forked child, on the real clock
    h.source = std::move(*s);
    return h;
  }
  auto leases = std::static_pointer_cast<FakeLeases>(c.broker);
  auto expirer = leases->Expirer(so);
  if (!expirer.ok()) return expirer.status();
  {
    std::lock_guard l(g_mu);
    g_leases[c.env] = leases;
  }
  h.source = std::make_unique<OnFakeEnv>(std::move(*s), leases, *expirer, fake, c.lease_ms);
  return h;
}

Result<std::shared_ptr<void>> StartLeases(const TempDir&) {
  return std::shared_ptr<void>(std::make_shared<FakeLeases>());
}

void AdvanceLeases(FakeEnv& env, int64_t ms) {
  env.Advance(ms);
  if (auto leases = LeasesOf(&env)) leases->ExpireDue(env.NowMs());
}

// Attributes are a map of text (binary values go base64-encoded under a
// prefixed name): headers come back sorted by name, one value per name, so
// not exactly as published. A plain subscription has no dead-letter policy
// (no deliveryAttempt) and accepts stale ack ids.
[[maybe_unused]] const bool kOnPlain = RegisterDeliverySuite(
    {.name = "pubsub",
     .promises = {.has_lease = true, .nack_redelivers_one = true, .survives_fork = true},
     .open = [](const TempDir& dir, const SourceConfig& c) { return OpenOn(dir, c, {.exactly_once = false}); },
     .advance = AdvanceLeases,
     .start = StartLeases});

// Exactly-once delivery with a dead-letter policy: the service counts
// attempts and refuses an ack id that expired or was acked.
[[maybe_unused]] const bool kOnExactlyOnce = RegisterDeliverySuite(
    {.name = "pubsub_exactly_once",
     .promises = {.has_lease = true,
                  .counts_attempts = true,
                  .nack_redelivers_one = true,
                  .reports_lease_lost = true,
                  .survives_fork = true},
     .open = [](const TempDir& dir, const SourceConfig& c) { return OpenOn(dir, c, {.exactly_once = true}); },
     .advance = AdvanceLeases,
     .start = StartLeases});

}  // namespace
}  // namespace idem::testing
