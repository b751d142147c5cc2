// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// OffsetInbox: the ordered-log mode for Kafka partitions. Instead of one
// marker per message, it keeps the last applied offset of each
// (consumer, topic, partition) in the table idem_kafka_offsets, written in
// the same transaction as the handler's work. A record at or below the
// stored offset is skipped (kDuplicate) without running the handler; on
// assignment the source starts each partition at the stored offset + 1
// (pass StartOffsets() as kafka::Source::Options::start_offset). Kafka's own
// committed offset becomes a hint. No per-message rows, nothing to purge.
//
//   auto oi = idem::kafka::OffsetInbox::Open(*store, {.consumer = "billing"});
//   auto src = idem::kafka::Source::Open({..., .start_offset = (*oi)->StartOffsets()});
//   auto got = (*src)->Receive(1, 500);
//   if (got.ok()) {
//     for (auto& d : *got) {
//       auto out = (*oi)->Handle(d, handler);
//       if (out.ShouldAck()) (*src)->Ack(d); else (*src)->Nack(d, 1000);
//     }
//   }
//
// Late members. A member that lost a partition (it stopped polling past
// max.poll.interval.ms, or was cut off from the brokers but not from the
// database) may still be inside Handle for one of its records while the new
// owner handles the same and later ones. Handle therefore claims the offset
// before it runs the handler, with one conditional statement that moves the
// stored offset up and never down, in the handler's transaction: exactly
// one transaction per (consumer, topic, partition, offset) commits an
// effect, whichever member it runs in; the other finds the offset taken
// (kDuplicate), and a late member's older offset can no longer overwrite a
// newer one. The new owner's claim waits for the late member's open
// transaction at most Options::lock_wait_ms, then hands the record back
// (kFailed, Code::kBusy: nack it), so that it does not itself overrun
// max.poll.interval.ms behind a stalled holder.
//
// What it needs, and what it does not do:
//   - Records of one partition must be handled one at a time and in order:
//     one thread per source, one record per Receive, and a failed record
//     nacked (the source then seeks back to it and holds later records of
//     the partition back). Applying offset 9 before offset 8 would make 8
//     look applied.
//   - It deduplicates redeliveries of a record (same topic, partition,
//     offset), not a producer retry, which is another record with another
//     offset: pair it with an idempotent producer (enable.idempotence), or
//     make the writes naturally idempotent, or use the Inbox (one marker per
//     message id).
//   - Not usable through idem::Consumer (which drives an Inbox): call
//     Handle yourself, as above.
//
// Thread safety: Handle may be called from many threads (for different
// partitions); the Store gives each call its own connection.
#ifndef IDEM_KAFKA_OFFSET_INBOX_H_
#define IDEM_KAFKA_OFFSET_INBOX_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/inbox.h"
#include "idem/result.h"
#include "idem/source.h"
#include "idem/store.h"

namespace idem::kafka {

class OffsetInbox {
 public:
  struct Options {
    // The consumer's name: part of the key, so several consumers can share
    // one database. 1..255 bytes. Default: "default".
    std::string consumer = "default";
    // How long Handle waits for the partition's offset row while another
    // transaction holds it (a member that lost the partition, still in its
    // handler) before giving the record back: kFailed with Code::kBusy.
    // > 0. Default: 10000.
    int64_t lock_wait_ms = 10'000;
  };

  // Creates idem_kafka_offsets if missing. `store` must outlive the result.
  // kInvalidArgument for a consumer name or lock_wait_ms out of range.
  static Result<std::unique_ptr<OffsetInbox>> Open(Store& store, const Options& options);
  static Result<std::unique_ptr<OffsetInbox>> Open(Store& store);
  OffsetInbox(const OffsetInbox&) = delete;
  OffsetInbox& operator=(const OffsetInbox&) = delete;

  // Handles one delivery of a kafka::Source: kApplied (handler ran, offset
  // stored, committed together), kDuplicate (offset at or below the stored
  // one: nothing ran), or kFailed (nothing committed; kHandlerFailed for
  // the handler's error, kBusy when another transaction held the
  // partition's offset past lock_wait_ms, kInvalidArgument for a receipt
  // that is not a Kafka one, a store code otherwise). A handler that throws
  // is kHandlerFailed, after the rollback, as in the Inbox. Kill points
  // (doc/reliability.md): offset_inbox.after_claim, offset_inbox.after_work,
  // offset_inbox.after_commit.
  Outcome Handle(const Delivery& delivery, const Handler& handler);

  // The last applied offset of a partition, nullopt when none is stored.
  Result<std::optional<int64_t>> LastApplied(std::string_view topic, int32_t partition);

  // For kafka::Source::Options::start_offset: the stored offset + 1, or nullopt
  // (Kafka's committed offset) when none is stored or the store fails.
  std::function<std::optional<int64_t>(std::string_view topic, int32_t partition)> StartOffsets();

 private:
  OffsetInbox(Store& store, Options options) : store_(store), options_(std::move(options)) {}
  Store& store_;
  Options options_;
};

}  // namespace idem::kafka

#endif  // IDEM_KAFKA_OFFSET_INBOX_H_
