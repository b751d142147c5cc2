// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The delivery suite (util/delivery_suite.h, delivery_suite_test.cc) on
// idem::sqs::Source and Publisher, on a standard queue and on a FIFO queue,
// each test on queues of its own, on the fixture "sqs-clock": fauxqs whose
// clock (the one its visibility timeouts and delays run on) stands still
// and is set by the test to the suite's fake clock
// (scripts/fauxqs-preload.cjs). So a lease of 10 s ends exactly 10 s of fake
// time after the receive, as on SQS, and the suite's cases run in
// milliseconds. The tests of this file share that clock: they run one at a
// time (RESOURCE_LOCK sqs_clock).
//
// What the wrapper below (Clocked) adds, and nothing else:
//   - before every call it sets the emulator's clock to the suite's Env;
//   - Receive(max, 0) is "everything visible now": SQS hands out at most 10
//     per call, so it asks again until a call finds nothing or max came;
//   - a Receive that waits waits in fake time (one fake second per round),
//     not in SQS's long poll (which would wait in real time while the
//     emulator's clock stands still). The source's own long polling is
//     tested on the real clock (sqs_source_test.cc).
//
// What SQS does not promise and is not claimed (doc/sources.md):
//   - reports_lease_lost: a DeleteMessage with an outdated receipt handle
//     answers success (SQS, and fauxqs, which then does not delete): Ack is
//     OK and the message comes again for the Inbox. ExtendLease and Nack of
//     an outdated handle are kLeaseLost (sqs_source_test.cc).
//   - FIFO: keys_in_parallel (a message group's next message waits for the
//     ack of the one before); and the suite's "published twice, delivered
//     twice" needs the publisher's deduplicate_by_id off (each copy a
//     deduplication id of its own), as a producer retry after SQS's 5-minute
//     deduplication window would be.
//   - Per-key order on a standard queue (BatchesKeepTheOrderOfEachKey): SQS
//     orders a standard queue best-effort only; fauxqs keeps one list, so the
//     case passes here. Only FIFO queues promise order (per group), which
//     sqs_source_test.cc checks.
#include <httplib.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "idem/sqs/source.h"
#include "sqs/sqs_test_util.h"
#include "util/delivery_suite.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

// Sets the emulator's clock to `ms` (ms since the epoch).
Status SetEmulatorClock(const std::string& endpoint, int64_t ms) {
  httplib::Client c(endpoint);
  auto r = c.Get("/__idem/clock?ms=" + std::to_string(ms));
  if (!r || r->status != 200 || r->body != std::to_string(ms))
    return Status::Unavailable("could not set the clock of the SQS emulator at " + endpoint);
  return Status::OK();
}

class Clocked final : public Source {
 public:
  Clocked(std::unique_ptr<sqs::Source> inner, Env* env, std::string endpoint)
      : inner_(std::move(inner)), env_(env), endpoint_(std::move(endpoint)) {}

  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override {
    if (max < 1) return inner_->Receive(max, 0);
    const int64_t end = env_->NowMs() + std::max<int64_t>(wait_ms, 0);
    for (;;) {
      IDEM_RETURN_IF_ERROR(Sync());
      std::vector<Delivery> out;
      while (static_cast<int>(out.size()) < max) {
        IDEM_ASSIGN_OR_RETURN(std::vector<Delivery> got, inner_->Receive(max - static_cast<int>(out.size()), 0));
        if (got.empty()) break;
        for (Delivery& d : got) out.push_back(std::move(d));
      }
      if (!out.empty() || env_->NowMs() >= end) return out;
      env_->SleepMs(std::min<int64_t>(1'000, end - env_->NowMs()));
    }
  }
  Status Ack(const Delivery& d) override {
    IDEM_RETURN_IF_ERROR(Sync());
    return inner_->Ack(d);
  }
  Status Nack(const Delivery& d, int64_t delay_ms) override {
    IDEM_RETURN_IF_ERROR(Sync());
    return inner_->Nack(d, delay_ms);
  }
  Status ExtendLease(const Delivery& d) override {
    IDEM_RETURN_IF_ERROR(Sync());
    return inner_->ExtendLease(d);
  }
  std::string_view Kind() const override { return inner_->Kind(); }
  int64_t lease_ms() const override { return inner_->lease_ms(); }

 private:
  // A forked child reads the real clock and leaves the emulator's alone.
  Status Sync() { return env_ == Env::Default() ? Status::OK() : SetEmulatorClock(endpoint_, env_->NowMs()); }

  std::unique_ptr<sqs::Source> inner_;
  Env* env_;
  std::string endpoint_;
};

Result<SourceHandle> OpenSqs(const TempDir& dir, const SourceConfig& c, bool fifo) {
  const std::string endpoint = SqsEndpoint("sqs-clock");
  const std::string queue = SqsQueueName(ServerNameFor(dir, "s-") + (c.other_channel ? "-other" : ""), fifo);
  IDEM_RETURN_IF_ERROR(CreateSqsQueue(endpoint, queue));  // CreateQueue of an existing queue: OK
  IDEM_RETURN_IF_ERROR(SetEmulatorClock(endpoint, c.env->NowMs()));
  auto s = sqs::Source::Open({.queue = queue, .connect = SqsConnect(endpoint), .lease_ms = c.lease_ms});
  if (!s.ok()) return s.status();
  auto p = sqs::Publisher::Open({.queue = queue, .connect = SqsConnect(endpoint), .deduplicate_by_id = false});
  if (!p.ok()) return p.status();
  std::shared_ptr<sqs::Publisher> pub = std::move(*p);
  SourceHandle h;
  h.publish = [pub](const Message& m) { return pub->Publish(m); };
  h.publisher = pub;
  h.channel = queue;
  h.source = std::make_unique<Clocked>(std::move(*s), c.env, endpoint);
  return h;
}

constexpr Capabilities kStandard{.has_lease = true,
                                 .counts_attempts = true,
                                 .nack_redelivers_one = true,
                                 .reports_lease_lost = false,
                                 .survives_fork = true,
                                 .headers_as_published = true,
                                 .empty_header_names = true,
                                 .keys_in_parallel = true};

[[maybe_unused]] const bool kOnStandard = RegisterDeliverySuite(
    {.name = "sqs_standard", .promises = kStandard, .open = [](const TempDir& dir, const SourceConfig& c) {
       return OpenSqs(dir, c, false);
     }});

[[maybe_unused]] const bool kOnFifo =
    RegisterDeliverySuite({.name = "sqs_fifo",
                           .promises =
                               [] {
                                 Capabilities p = kStandard;
                                 p.keys_in_parallel = false;
                                 return p;
                               }(),
                           .open = [](const TempDir& dir, const SourceConfig& c) { return OpenSqs(dir, c, true); }});

}  // namespace
}  // namespace idem::testing
