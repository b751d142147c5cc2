// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// MemorySource: an at-least-once Source (idem/source.h) in memory, for tests
// of a Consumer, or of code of your own that takes a Source. It records
// every ack and nack, redelivers what is nacked (after its delay, on its
// clock) and what is not acknowledged before its lease runs out, and can
// lose acknowledgements on demand: a lost ack answers OK, and the message
// comes again, as a broker does when an ack never reaches it.
//
//   idem::FakeEnv clock;
//   idem::testing::MemorySource source({.env = &clock});
//   source.Push(idem::testing::Msg("m-1", "alice 40"));
//   source.LoseAcks(1);                 // the next ack is lost: m-1 comes again
//   auto consumer = idem::Consumer::Open(source, *inbox, handler, {...});
//   ... source.acked() == 1, source.deliveries() == 2
//
// Thread safety: every method may be called from many threads.
#ifndef IDEM_TESTING_MEMORY_SOURCE_H_
#define IDEM_TESTING_MEMORY_SOURCE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "idem/env.h"
#include "idem/message.h"
#include "idem/source.h"

namespace idem::testing {

class MemorySource final : public Source {
 public:
  struct Options {
    // A delivery not acknowledged within this is delivered again (0: never;
    // it stays with its receiver until acked or nacked). Default: 30 s.
    int64_t lease_ms = 30'000;
    // The clock of leases and nack delays. Default: Env::Default().
    Env* env = nullptr;
  };
  MemorySource();
  explicit MemorySource(Options options);

  // Queues a message (its attempt is counted by the source).
  void Push(Message message);
  // The next `n` acks are lost: answered OK, the message stays and comes
  // again once its lease runs out (at once when lease_ms is 0).
  void LoseAcks(int n);

  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override;
  Status Ack(const Delivery& delivery) override;
  Status Nack(const Delivery& delivery, int64_t delay_ms) override;
  std::string_view Kind() const override { return "memory"; }
  int64_t lease_ms() const override { return options_.lease_ms; }
  Status ExtendLease(const Delivery& delivery) override;

  // What happened so far.
  int64_t deliveries() const;  // messages handed out, redeliveries included
  int64_t acked() const;       // acks that took effect
  int64_t lost_acks() const;   // acks answered OK and dropped
  int64_t nacked() const;
  // Messages not yet acknowledged (queued or out).
  int64_t pending() const;
  // The ids acknowledged, in order.
  std::vector<std::string> acked_ids() const;

 private:
  struct Entry {
    Message message{};
    int attempts = 0;
    uint64_t receipt = 0;       // the current delivery's; 0: not out
    int64_t visible_at_ms = 0;  // not before this
  };
  Env& env() const { return options_.env ? *options_.env : *Env::Default(); }

  Options options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Entry> entries_;  // by sequence: delivery order
  uint64_t next_seq_ = 1, next_receipt_ = 1;
  int lose_acks_ = 0;
  int64_t deliveries_ = 0, acked_ = 0, lost_acks_ = 0, nacked_ = 0;
  std::vector<std::string> acked_ids_;
};

}  // namespace idem::testing

#endif  // IDEM_TESTING_MEMORY_SOURCE_H_
