// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The outbox relay against real sources: a workload added to a SQLite
// store's outbox, a relay that drains it into a source's Publisher, a
// publisher that logs what the broker confirmed (also in a child that is
// killed mid-relay), and the checks of what the source delivers back (every
// row, its bytes and headers, each key's first copies in seq order). Used by
// the delivery suite (conformance/delivery_suite_test.cc) and the broker
// restart tests of the sources.
#ifndef IDEM_TEST_UTIL_RELAY_UTIL_H_
#define IDEM_TEST_UTIL_RELAY_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "idem/outbox.h"
#include "idem/outbox_relay.h"
#include "idem/outbox_store.h"
#include "idem/publisher.h"
#include "idem/source.h"
#include "idem/sqlite/store.h"
#include "idem/store.h"

namespace idem::testing {

// `n` messages over `keys` ordering keys: id "<prefix>-<i>", key
// "<prefix>-key-<i % keys>", a payload with binary bytes, a traceparent and a
// producer time of their own.
struct RelayWorkload {
  RelayWorkload(int n, int keys, const std::string& prefix = "ob") {
    for (int i = 0; i < n; ++i) {
      OutgoingMessage m;
      m.id = prefix + "-" + std::to_string(i);
      m.key = prefix + "-key-" + std::to_string(i % keys);
      m.payload = "payload " + std::to_string(i) + std::string("\0\x01\xfe\xff", 4);
      m.headers = {
          {"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e" + std::to_string(1000 + i) + "-00f067aa0ba902b7-01"}};
      m.producer_time_ms = 1'712'345'000'000 + i;
      by_id[m.id] = messages.size();
      messages.push_back(std::move(m));
    }
  }
  const OutgoingMessage* Find(const std::string& id) const {
    auto it = by_id.find(id);
    return it == by_id.end() ? nullptr : &messages[it->second];
  }
  std::vector<OutgoingMessage> messages;
  std::map<std::string, size_t> by_id;
};

inline Result<std::unique_ptr<Store>> OpenOutboxStore(const std::string& path) {
  return sqlite::Store::Open({.path = path});
}

// Adds `messages` to the outbox of `store`, `per_tx` per committed transaction.
inline Status AddInTransactions(Store& store, std::span<const OutgoingMessage> messages, size_t per_tx) {
  auto outbox = Outbox::Open(store);
  if (!outbox.ok()) return outbox.status();
  for (size_t i = 0; i < messages.size(); i += per_tx) {
    auto tx = store.Begin();
    if (!tx.ok()) return tx.status();
    auto ids = (*outbox)->AddMany(**tx, messages.subspan(i, std::min(per_tx, messages.size() - i)));
    if (!ids.ok()) return ids.status();
    IDEM_RETURN_IF_ERROR((*tx)->Commit());
  }
  return Status::OK();
}

// A relay that returns once the outbox is empty, on the real clock, with
// short backoffs (a broker that went away comes back within the test).
inline OutboxRelay::Options DrainOptions(int batch) {
  OutboxRelay::Options o;
  o.batch = batch;
  o.poll_ms = 50;
  o.backoff_base_ms = 20;
  o.backoff_max_ms = 200;
  o.stop_when_idle = true;
  return o;
}

// Runs a relay from `store` to `publisher` until the outbox is empty.
inline Result<OutboxRelayStats> DrainOutbox(Store& store, Publisher& publisher, const OutboxRelay::Options& options) {
  auto relay = OutboxRelay::Open(store, publisher, options);
  if (!relay.ok()) return relay.status();
  IDEM_RETURN_IF_ERROR((*relay)->Run());
  return (*relay)->stats();
}

// One outbox row as it reaches the broker: its id and its idem-outbox-seq
// (a message added twice is two rows; a republish is the same row again).
using RelayedRow = std::pair<std::string, int64_t>;

inline std::optional<int64_t> OutboxSeq(const Message& m) {
  auto h = m.Header(kOutboxSeqHeader);
  if (!h.has_value()) return std::nullopt;
  try {
    return std::stoll(std::string(*h));
  } catch (...) {
    return std::nullopt;
  }
}

// Forwards to `inner`; a subclass sees (and may change) each PublishBatch's
// answers before they are returned.
class ForwardingPublisher : public Publisher {
 public:
  explicit ForwardingPublisher(Publisher& inner) : inner_(inner) {}

  Status Publish(const Message& m) final {
    Outgoing o{{}, {}, &m};
    return PublishBatch(std::span<const Outgoing>(&o, 1))[0];
  }
  std::vector<Status> PublishBatch(std::span<const Outgoing> batch) final {
    std::vector<Status> got = inner_.PublishBatch(batch);
    Answered(batch, got);
    return got;
  }
  PublisherTraits traits() const final { return inner_.traits(); }
  std::string_view Channel() const final { return inner_.Channel(); }
  std::string_view Kind() const final { return inner_.Kind(); }

 protected:
  virtual void Answered(std::span<const Outgoing> batch, std::vector<Status>& got) = 0;

 private:
  Publisher& inner_;
};

// Forwards to `inner` and appends every row the broker confirmed to the
// file `path` ("<seq> <id>" a line) before PublishBatch returns, so that a
// process killed right after the publish has logged it; a row whose publish
// ended in doubt (no confirm came: it may be at the broker) goes to
// InDoubtLog(path). `after_batch`, if set, runs after each PublishBatch with
// the number of batches so far (a test stops its broker there: mid-relay, at
// a known place).
class LoggingPublisher final : public ForwardingPublisher {
 public:
  LoggingPublisher(Publisher& inner, const std::string& path, std::function<void(int)> after_batch = {})
      : ForwardingPublisher(inner),
        log_(path, std::ios::app),
        in_doubt_(InDoubtLog(path), std::ios::app),
        after_batch_(std::move(after_batch)) {}
  static std::string InDoubtLog(const std::string& path) { return path + ".in-doubt"; }

 private:
  void Answered(std::span<const Outgoing> batch, std::vector<Status>& got) override {
    for (size_t i = 0; i < got.size() && i < batch.size(); ++i) {
      std::ofstream* to = got[i].ok() ? &log_ : got[i].IsInDoubt() ? &in_doubt_ : nullptr;
      if (to != nullptr) *to << OutboxSeq(*batch[i].message).value_or(-1) << " " << batch[i].message->id << "\n";
    }
    log_.flush();
    in_doubt_.flush();
    if (after_batch_) after_batch_(++batches_);
  }

  std::ofstream log_, in_doubt_;
  std::function<void(int)> after_batch_;
  int batches_ = 0;
};

// Forwards to `inner`, and reports the items [from, to) of its `nth`
// PublishBatch as in doubt although the broker took them: as when their
// confirms do not come in time (a loaded broker), so that a relay publishes
// them again and the broker holds one copy more than it confirmed.
class DoubtfulPublisher final : public ForwardingPublisher {
 public:
  DoubtfulPublisher(Publisher& inner, int nth, size_t from, size_t to)
      : ForwardingPublisher(inner), nth_(nth), from_(from), to_(to) {}

 private:
  void Answered(std::span<const Outgoing>, std::vector<Status>& got) override {
    if (++batches_ != nth_) return;
    for (size_t i = from_; i < to_ && i < got.size(); ++i)
      if (got[i].ok()) got[i] = Status::InDoubt("test: no confirm came in time (the broker has the message)");
  }

  const int nth_;
  const size_t from_, to_;
  int batches_ = 0;
};

// What a LoggingPublisher logged: copies per row.
inline std::map<RelayedRow, int> ReadPublishLog(const std::string& path) {
  std::map<RelayedRow, int> out;
  std::ifstream in(path);
  int64_t seq = 0;
  for (std::string id; in >> seq >> id;) ++out[{id, seq}];
  return out;
}

// The copies of each row in `logs` together, and how many in all.
inline std::map<RelayedRow, int> MergeLogs(std::initializer_list<std::map<RelayedRow, int>> logs) {
  std::map<RelayedRow, int> out;
  for (const auto& log : logs)
    for (const auto& [row, n] : log) out[row] += n;
  return out;
}
inline size_t CountCopies(const std::map<RelayedRow, int>& copies) {
  size_t n = 0;
  for (const auto& [row, c] : copies) n += static_cast<size_t>(c);
  return n;
}

// Whether `d` is the broker's redelivery (attempt 2 or more) of a row that
// `settled` holds (received and acknowledged in an earlier round): a broker
// may deliver again a message whose acknowledgement it had not settled when
// the consumer's connection closed (RabbitMQ's quorum queues settle an ack
// and return a closed consumer's messages as two separate steps). Not a copy
// the relay made: a publish arrives as attempt 1.
inline bool RedeliveryOfSettled(const Delivery& d, const std::set<RelayedRow>& settled) {
  return d.message.attempt > 1 && settled.count({d.message.id, OutboxSeq(d.message).value_or(-1)}) > 0;
}

// Receives the copies of relayed rows until every copy the broker confirmed
// (`confirmed`) is there: `receive(n)` receives up to n. A copy beyond its
// row's confirmed count is one of a publish that ended in doubt when there
// is one left in `in_doubt` (which it takes; such a copy may also come after
// later rows, or in a later round on the same channel), or a redelivery of a
// row in `settled` (RedeliveryOfSettled): it is acknowledged and not
// returned. Any other copy is returned, for the checks to name.
inline std::vector<Delivery> ReceiveConfirmed(Source& source, const std::map<RelayedRow, int>& confirmed,
                                              std::map<RelayedRow, int>& in_doubt, const std::set<RelayedRow>& settled,
                                              const std::function<std::vector<Delivery>(size_t)>& receive) {
  std::map<RelayedRow, int> room = confirmed;
  const size_t want = CountCopies(confirmed);
  std::vector<Delivery> got;
  while (got.size() < want) {
    std::vector<Delivery> more = receive(want - got.size());
    if (more.empty()) break;
    for (Delivery& d : more) {
      const RelayedRow row{d.message.id, OutboxSeq(d.message).value_or(-1)};
      if (auto r = room.find(row); r != room.end() && r->second > 0) {
        --r->second;
      } else if (auto m = in_doubt.find(row); m != in_doubt.end() && m->second > 0) {
        --m->second;
        EXPECT_TRUE(source.Ack(d).ok()) << d.message.id;
        continue;
      } else if (RedeliveryOfSettled(d, settled)) {
        EXPECT_TRUE(source.Ack(d).ok()) << d.message.id;
        continue;
      }
      got.push_back(std::move(d));
    }
  }
  return got;
}

// Each row was delivered as often as its broker confirmed it: no copy lost,
// none made up.
inline void ExpectCopiesAsConfirmed(const std::map<RelayedRow, int>& delivered,
                                    const std::map<RelayedRow, int>& confirmed) {
  for (const auto& [row, n] : confirmed) {
    auto it = delivered.find(row);
    EXPECT_EQ(it == delivered.end() ? 0 : it->second, n) << row.first << " seq " << row.second << ": copies delivered";
  }
  for (const auto& [row, n] : delivered)
    EXPECT_TRUE(confirmed.count(row)) << row.first << " seq " << row.second << " was delivered, never confirmed";
}

// Drains `store`'s outbox into `publisher` across a broker restart: after
// the relay's `stop_after`-th PublishBatch, `stop` takes the broker away (in
// the relay's thread, so mid-relay at a known place) and `start` brings it
// back on a thread of its own while the relay's publishes fail and back
// off. What the broker confirmed is logged to `log`.
inline Result<OutboxRelayStats> DrainAcrossABrokerRestart(Store& store, Publisher& publisher, const std::string& log,
                                                          int stop_after, const std::function<void()>& stop,
                                                          const std::function<void()>& start) {
  std::thread restarter;
  LoggingPublisher logged(publisher, log, [&](int batches) {
    if (batches != stop_after) return;
    stop();
    restarter = std::thread(start);
  });
  auto stats = DrainOutbox(store, logged, DrainOptions(10));
  if (restarter.joinable()) restarter.join();
  return stats;
}

// Checks what a source delivered of a relayed workload that was added
// `adds` times (each time in one order): every copy is a workload message
// with its payload, producer time, traceparent and ordering key intact and
// an idem-outbox-seq; every message arrived as `adds` rows; per key, the
// first copies of the rows came in increasing seq order (the deliveries are
// in the order one consumer received them, which on every source keeps the
// order of a key: Kafka's record key is the ordering key, so a key stays in
// one partition). Returns the copies per row.
inline std::map<RelayedRow, int> ExpectRelayed(const RelayWorkload& w, const std::vector<Delivery>& got, int adds) {
  std::map<RelayedRow, int> copies;
  std::map<std::string, std::vector<int64_t>> first_seqs;  // per key, in the order received
  std::map<std::string, std::set<int64_t>> rows_of;        // per id
  for (const Delivery& d : got) {
    const Message& m = d.message;
    const OutgoingMessage* want = w.Find(m.id);
    if (want == nullptr) {
      // Its attempt tells a redelivery (> 1: a copy received and requeued)
      // from a copy published once more (1).
      ADD_FAILURE() << "not a message of the workload: " << m.id << " (attempt " << m.attempt << ")";
      continue;
    }
    EXPECT_TRUE(m.payload == want->payload) << m.id;
    EXPECT_EQ(m.producer_time_ms, want->producer_time_ms) << m.id;
    EXPECT_EQ(m.Header("traceparent"), std::optional<std::string_view>(want->headers[0].second)) << m.id;
    EXPECT_EQ(m.Header(kOrderingKeyHeader), std::optional<std::string_view>(want->key)) << m.id;
    std::optional<int64_t> seq = OutboxSeq(m);
    if (!seq.has_value()) {
      ADD_FAILURE() << m.id << " has no " << kOutboxSeqHeader;
      continue;
    }
    if (copies[{m.id, *seq}]++ == 0) first_seqs[want->key].push_back(*seq);
    rows_of[m.id].insert(*seq);
  }
  for (const OutgoingMessage& m : w.messages)
    EXPECT_EQ(rows_of[m.id].size(), static_cast<size_t>(adds)) << m.id << ": rows delivered";
  for (const auto& [key, seqs] : first_seqs)
    for (size_t i = 1; i < seqs.size(); ++i)
      EXPECT_LT(seqs[i - 1], seqs[i]) << "key " << key << ": first copies out of order at " << i;
  return copies;
}

}  // namespace idem::testing

#endif  // IDEM_TEST_UTIL_RELAY_UTIL_H_
