// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Kafka's offset mode, the store's side, before and after the offset became
// a claim (issue: every late writer fenced): in alternating rounds on one
// store, the same records handled by
//   before: the earlier kafka::OffsetInbox::Handle, kept here verbatim in
//           shape: BEGIN, read last_offset, the handler, an unconditional
//           upsert of last_offset, COMMIT;
//   after:  kafka::OffsetInbox::Handle as it is: BEGIN (held back), the
//           lock bound and the monotonic claim in one round trip, the
//           handler, COMMIT.
// The handler inserts one effect row. Records come from no broker (the
// source is not what changed, and its keeper is idle while Receive polls):
// a receipt per offset, 4 partitions in turn.
//
//   offset_inbox_ab STORE_URL [records_per_round=2000] [rounds=6]
//   -> one line per round, then a JSON summary: median after/before.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "idem/kafka/offset_inbox.h"
#include "idem/kafka/source.h"
#include "idem/open.h"

namespace {

using idem::Status;

constexpr int kPartitions = 4;

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

Status Effect(idem::Transaction& tx, const idem::Message& m) {
  return tx.Exec("INSERT INTO offset_ab_effects(message_id) VALUES ($1)", {m.id}).status();
}

// The earlier Handle: read, handler, unconditional upsert, commit.
Status Before(idem::Store& store, const std::string& topic, int32_t partition, int64_t offset, const idem::Message& m) {
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  IDEM_ASSIGN_OR_RETURN(idem::Rows rows,
                        tx->Query("SELECT last_offset FROM idem_kafka_offsets WHERE consumer = $1 AND topic = $2 AND "
                                  "topic_partition = $3",
                                  {"before", topic, partition}));
  if (!rows.rows.empty() && offset <= rows.rows[0][0].AsInt()) return Status::OK();
  IDEM_RETURN_IF_ERROR(Effect(*tx, m));
  IDEM_RETURN_IF_ERROR(tx->Exec("INSERT INTO idem_kafka_offsets(consumer, topic, topic_partition, last_offset) "
                                "VALUES ($1, $2, $3, $4) ON CONFLICT (consumer, topic, topic_partition) DO UPDATE "
                                "SET last_offset = excluded.last_offset",
                                {"before", topic, partition, offset})
                           .status());
  return tx->Commit();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: offset_inbox_ab STORE_URL [records_per_round] [rounds]\n";
    return 2;
  }
  const int n = argc > 2 ? std::atoi(argv[2]) : 2'000;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 6;
  auto store = idem::OpenStore(argv[1]);
  if (!store.ok()) {
    std::cerr << "offset_inbox_ab: " << store.status() << "\n";
    return 1;
  }
  {
    auto tx = (*store)->Begin();
    if (!tx.ok() || !(*tx)->Exec("CREATE TABLE IF NOT EXISTS offset_ab_effects(message_id TEXT NOT NULL)").ok() ||
        !(*tx)->Commit().ok()) {
      std::cerr << "offset_inbox_ab: cannot create the effect table\n";
      return 1;
    }
  }
  auto after = idem::kafka::OffsetInbox::Open(**store, {.consumer = "after"});
  if (!after.ok()) {
    std::cerr << "offset_inbox_ab: " << after.status() << "\n";
    return 1;
  }
  std::vector<double> ratios;
  int64_t next = 0;  // offsets keep growing across rounds: every record is new
  for (int round = 0; round < rounds; ++round) {
    double rate[2] = {0, 0};
    // Alternate which goes first, so neither always meets a warmer cache.
    for (int k = 0; k < 2; ++k) {
      const bool is_after = (k + round) % 2 == 1;
      const std::string topic = std::string("ab-") + (is_after ? "after" : "before");
      const double t0 = Now();
      for (int i = 0; i < n; ++i) {
        const int32_t partition = i % kPartitions;
        const int64_t offset = next + i / kPartitions;
        idem::Delivery d;
        d.message.id = topic + "-" + std::to_string(round) + "-" + std::to_string(i);
        d.receipt = idem::kafka::EncodeReceipt({topic, partition, offset, 1});
        Status s;
        if (is_after) {
          idem::Outcome o = (*after)->Handle(d, Effect);
          if (!o.applied()) s = Status::Internal("not applied: " + o.ToString());
        } else {
          s = Before(**store, topic, partition, offset, d.message);
        }
        if (!s.ok()) {
          std::cerr << "offset_inbox_ab: " << s << "\n";
          return 1;
        }
      }
      rate[is_after ? 1 : 0] = n / (Now() - t0);
    }
    next += n / kPartitions + 1;
    ratios.push_back(rate[1] / rate[0]);
    std::printf("round %d: before %.0f/s, after %.0f/s, after/before %.3f\n", round + 1, rate[0], rate[1],
                ratios.back());
    std::fflush(stdout);
  }
  std::vector<double> sorted = ratios;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted.size() % 2 == 1 ? sorted[sorted.size() / 2]
                                               : (sorted[sorted.size() / 2 - 1] + sorted[sorted.size() / 2]) / 2;
  std::printf(
      "{\"store\":\"%s\",\"records_per_round\":%d,\"rounds\":%d,\"median_after_over_before\":%.3f,"
      "\"min\":%.3f,\"max\":%.3f}\n",
      std::string((*store)->Kind()).c_str(), n, rounds, median, sorted.front(), sorted.back());
  return 0;
}
