// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The marker benchmark's workload, shared by `idem bench marker`
// (tools/idem/bench.cc) and the Google Benchmark target
// (bench/marker_benchmark.cc), so that both measure the same thing:
//
//   bare:    BEGIN; B x INSERT INTO bench_payments ...; COMMIT
//   guarded: the same inserts as the handler of Inbox::Handle (B = 1) or
//            Inbox::HandleBatch (B > 1): marker insert, savepoints, commit
//
// with fresh ids for every message, random (UUIDv4-like) or time-ordered
// (UUIDv7-like), on top of N markers already retained by the same consumer.
//
// Header-only on purpose: the idem tool must build without the bench/
// directory's CMake targets (IDEM_BUILD_BENCH=OFF).
//
// Thread safety: none; one workload per thread.
#ifndef IDEM_BENCH_MARKER_WORKLOAD_H_
#define IDEM_BENCH_MARKER_WORKLOAD_H_

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "idem/inbox.h"
#include "idem/message.h"
#include "idem/status.h"
#include "idem/store.h"

namespace idem::bench {

// The business work: one row per payment. No index, so the bare side pays
// for an append to a rowid table and nothing else.
inline constexpr const char* kCreateBusinessTable =
    "CREATE TABLE IF NOT EXISTS bench_payments(message_id TEXT NOT NULL, cents INTEGER NOT NULL)";
inline constexpr const char* kClearBusinessTable = "DELETE FROM bench_payments";
inline constexpr const char* kInsertPayment = "INSERT INTO bench_payments(message_id, cents) VALUES ($1, $2)";
inline constexpr const char* kCountPayments = "SELECT count(*) FROM bench_payments";

enum class IdKind { kRandom, kOrdered };

inline std::string_view IdKindName(IdKind k) { return k == IdKind::kRandom ? "random" : "ordered"; }

// splitmix64: fast, good enough for ids and amounts, seedable.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

 private:
  uint64_t s_;
};

inline uint64_t FreshSeed() {
  std::random_device rd;
  uint64_t t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (t * 0x9e3779b97f4a7c15ULL);
}

// Message ids in the canonical 36-character UUID text form.
//   random:  version 4, 122 random bits, so a fresh id never meets a retained
//            one (the chance is about n^2 / 2^123).
//   ordered: version 7, 48-bit Unix milliseconds, then a 42-bit counter
//            (RFC 9562, method 1) reseeded every millisecond, then 32 random
//            bits: strictly increasing within a generator, and later than
//            every id made before (by any earlier run) while the clock moves
//            forward.
class IdGenerator {
 public:
  IdGenerator(IdKind kind, uint64_t seed) : kind_(kind), rng_(seed) {}

  // Writes the next id into `out` (reusing its buffer).
  void Next(std::string& out) {
    uint8_t b[16];
    if (kind_ == IdKind::kRandom) {
      uint64_t hi = rng_.Next(), lo = rng_.Next();
      for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(hi >> (56 - 8 * i));
      for (int i = 0; i < 8; ++i) b[8 + i] = static_cast<uint8_t>(lo >> (56 - 8 * i));
      b[6] = static_cast<uint8_t>(0x40 | (b[6] & 0x0f));
    } else {
      int64_t now =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      if (now > last_ms_) {
        last_ms_ = now;
        counter_ = rng_.Next() & ((uint64_t{1} << 41) - 1);  // top bit clear: room to count
      } else if (++counter_ >> 42) {
        ++last_ms_;  // counter exhausted (or the clock went back): borrow the next millisecond
        counter_ = 0;
      }
      uint64_t ms = static_cast<uint64_t>(last_ms_);
      for (int i = 0; i < 6; ++i) b[i] = static_cast<uint8_t>(ms >> (40 - 8 * i));
      uint64_t rand_a = counter_ >> 30;             // 12 bits
      uint64_t counter_lo = counter_ & 0x3fffffff;  // 30 bits
      b[6] = static_cast<uint8_t>(0x70 | (rand_a >> 8));
      b[7] = static_cast<uint8_t>(rand_a);
      // rand_b: 62 bits = 30 counter bits then 32 random bits.
      uint64_t rand_b = (counter_lo << 32) | (rng_.Next() & 0xffffffffULL);
      for (int i = 0; i < 8; ++i) b[8 + i] = static_cast<uint8_t>(rand_b >> (56 - 8 * i));
    }
    b[8] = static_cast<uint8_t>(0x80 | (b[8] & 0x3f));  // RFC 9562 variant
    static constexpr char kHex[] = "0123456789abcdef";
    out.resize(36);
    size_t o = 0;
    for (int i = 0; i < 16; ++i) {
      if (i == 4 || i == 6 || i == 8 || i == 10) out[o++] = '-';
      out[o++] = kHex[b[i] >> 4];
      out[o++] = kHex[b[i] & 0x0f];
    }
  }

  Rng& rng() { return rng_; }

 private:
  IdKind kind_;
  Rng rng_;
  int64_t last_ms_ = 0;
  uint64_t counter_ = 0;
};

// Refills `batch` with `n` fresh messages: a new id each, the amount in cents
// as the payload (so the fingerprint is that of a real, small body).
// Every message carries its producer's time (as outbox events do), used only
// by an Inbox with key_by_producer_time.
inline void NextBatch(IdGenerator& ids, std::vector<Message>& batch, size_t n) {
  batch.resize(n);
  const int64_t now =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  for (Message& m : batch) {
    ids.Next(m.id);
    m.payload = std::to_string(1 + ids.rng().Next() % 1'000'000);
    m.producer_time_ms = now;
  }
}

// The business work for one message, on the caller's transaction.
inline Status PaymentWork(Transaction& tx, const Message& m) {
  int64_t cents = 0;
  std::from_chars(m.payload.data(), m.payload.data() + m.payload.size(), cents);
  return tx.Exec(kInsertPayment, {Value(std::string_view(m.id)), Value(cents)}).status();
}

inline const Handler& PaymentHandler() {
  static const Handler h = PaymentWork;
  return h;
}

// Bare: the same work in a transaction of its own, no marker.
inline Status BareBatch(Store& store, std::span<const Message> batch) {
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  for (const Message& m : batch) IDEM_RETURN_IF_ERROR(PaymentWork(*tx, m));
  return tx->Commit();
}

inline Status CheckApplied(const Outcome& o, const Message& m) {
  if (o.applied()) return Status::OK();
  if (o.kind == Outcome::Kind::kFailed) return o.status;
  return Status::Internal("fresh id " + m.id + " was not applied (" + o.ToString() +
                          "): it collided with a retained marker");
}

// Guarded: the same work as the handler of the Inbox, Handle for one message,
// HandleBatch for more. Every fresh message must come back applied.
inline Status GuardedBatch(Inbox& inbox, std::span<const Message> batch) {
  if (batch.size() == 1) return CheckApplied(inbox.Handle(batch[0], PaymentHandler()), batch[0]);
  std::vector<Outcome> out = inbox.HandleBatch(batch, PaymentHandler());
  for (size_t i = 0; i < out.size(); ++i) IDEM_RETURN_IF_ERROR(CheckApplied(out[i], batch[i]));
  return Status::OK();
}

// Creates the business table (if missing) and empties it.
inline Status PrepareBusinessTable(Store& store) {
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  IDEM_RETURN_IF_ERROR(tx->Exec(kCreateBusinessTable).status());
  IDEM_RETURN_IF_ERROR(tx->Exec(kClearBusinessTable).status());
  return tx->Commit();
}

// Brings the consumer's retained markers up to `target` with the real layout:
// Inbox::HandleBatch with a no-op handler, `chunk` messages per transaction.
// Calls progress(done, to_add) after each chunk. Returns how many it added.
// `env` (default: the real clock) stamps processed_at; a FakeEnv advanced by
// `progress` spreads the markers over days (the purge benchmark does).
inline Result<int64_t> Retain(Store& store, const std::string& consumer, IdKind kind, int64_t target, int chunk,
                              const std::function<void(int64_t, int64_t)>& progress = {}, Env* env = nullptr,
                              bool key_by_producer_time = false) {
  IDEM_ASSIGN_OR_RETURN(int64_t have, store.CountMarkers(consumer));
  if (have >= target) return int64_t{0};
  const int64_t to_add = target - have;
  IDEM_ASSIGN_OR_RETURN(
      std::unique_ptr<Inbox> inbox_owned,
      Inbox::Open(store,
                  Inbox::Options{.consumer = consumer, .key_by_producer_time = key_by_producer_time, .env = env}));
  Inbox& inbox = *inbox_owned;
  IdGenerator ids(kind, FreshSeed());
  const Handler noop = [](Transaction&, const Message&) { return Status::OK(); };
  std::vector<Message> batch;
  int64_t added = 0;
  while (added < to_add) {
    NextBatch(ids, batch, static_cast<size_t>(std::min<int64_t>(chunk, to_add - added)));
    std::vector<Outcome> out = inbox.HandleBatch(batch, noop);
    for (const Outcome& o : out) {
      if (o.applied())
        ++added;
      else if (o.kind == Outcome::Kind::kFailed)
        return o.status.WithContext("retaining markers");
      // A duplicate (vanishingly rare) is simply not counted.
    }
    if (progress) progress(added, to_add);
  }
  return added;
}

// One side of a side-by-side measurement: messages and time over its
// rounds, and each round's rate.
struct Side {
  int64_t messages = 0;
  double seconds = 0;
  std::vector<double> rounds;  // messages per second of each round
  double PerSecond() const { return seconds > 0 ? static_cast<double>(messages) / seconds : 0; }
};

// Runs batches of `batch` fresh messages through `run` for about `seconds`.
template <typename Run>
Status Round(IdGenerator& ids, std::vector<Message>& msgs, int64_t batch, double seconds, Side* side, Run&& run) {
  int64_t n = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    bench::NextBatch(ids, msgs, static_cast<size_t>(batch));
    IDEM_RETURN_IF_ERROR(run(std::span<const Message>(msgs)));
    n += batch;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < seconds);
  if (side != nullptr) {
    side->messages += n;
    side->seconds += elapsed;
    side->rounds.push_back(static_cast<double>(n) / elapsed);
  }
  return Status::OK();
}

// The same with `consumers` threads at once, each with its own ids and
// messages; the side's rate is all their messages over the round's time.
template <typename Run>
Status ParallelRound(IdKind kind, int consumers, int64_t batch, double seconds, Side* side, Run&& run) {
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(consumers));
  std::vector<int64_t> counts(consumers, 0);
  std::vector<Status> errors(consumers);
  const auto t0 = std::chrono::steady_clock::now();
  for (int c = 0; c < consumers; ++c) {
    threads.emplace_back([&, c] {
      IdGenerator ids(kind, FreshSeed());
      std::vector<Message> msgs;
      Side mine;
      errors[c] = Round(ids, msgs, batch, seconds, &mine, run);
      counts[c] = mine.messages;
    });
  }
  for (auto& t : threads) t.join();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const Status& e : errors) IDEM_RETURN_IF_ERROR(e);
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  if (side != nullptr) {
    side->messages += n;
    side->seconds += elapsed;
    side->rounds.push_back(static_cast<double>(n) / elapsed);
  }
  return Status::OK();
}

}  // namespace idem::bench

#endif  // IDEM_BENCH_MARKER_WORKLOAD_H_
