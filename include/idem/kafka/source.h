// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The Kafka source (librdkafka; tested against librdkafka 2.0 and its mock
// cluster): a consumer-group member that hands records to the Consumer
// runner as deliveries, with auto commit and auto offset store off, so that
// an offset is committed only once the work of its record is committed.
//
//   auto src = idem::kafka::Source::Open({.brokers = "k1:9092", .topic = "payments", .group = "billing"});
//   if (!src.ok()) return src.status();
//   idem::Consumer consumer(**src, inbox, handler);
//   consumer.Run();
//
// What a delivery is:
//   - message.id comes from the record header Options::id_header (default
//     "id"), or from the record key when Options::id_from_key is set and the
//     header is missing. A record with neither gets an empty id: the Inbox
//     rejects it and the Consumer dead-letters it.
//   - message.attempt is always 0 (unknown): Kafka keeps no delivery count.
//     The Consumer then counts failures in the store, as it does for any
//     source without a count.
//   - message.headers are all the record's headers (the id's and the
//     producer time's included); message.producer_time_ms comes from the
//     header "idem-producer-time-ms" (the Publisher below writes it; the
//     former name "idem-produced-at-ms" is read too, doc/wire-format.md),
//     never from the record timestamp, which a producer retry changes.
//   - The receipt names topic, partition, offset and the assignment of the
//     partition it came from.
//
// Acks and commits. A partition is a log: committing offset N says "every
// record below N is done". So Ack never commits past an unacknowledged
// record: the source keeps, per assigned partition, the offsets it delivered
// and not yet acknowledged, and commits (asynchronously) the end of the
// acknowledged prefix. A record acknowledged after a later one is covered by
// the commit that follows its own ack. Kafka's committed offset is where a
// consumer restarts after a crash or a rebalance; records after it may have
// been applied already, and the Inbox absorbs their repeats.
//
// Nack(delay): after the delay (judged by Options::env), the next Receive
// seeks the partition back to the nacked offset. Kafka cannot skip around
// inside a partition, so every record after that offset is delivered again
// too (records of that partition fetched before the seek are held back and
// come again after it); the Inbox absorbs the repeats. Several nacks on one
// partition seek once, to the lowest offset, when the latest delay is over.
//
// Rebalances. On assignment each partition gets a new assignment number,
// carried by the receipts; Options::start_offset may choose where a
// partition starts (the ordered-log mode uses it). On revocation the source
// waits up to Options::revoke_wait_ms for deliveries of the revoked
// partitions still being worked on to be acknowledged or nacked, commits
// the acknowledged prefixes (synchronously), and then forgets the
// partitions: a later Ack or Nack of one of their receipts returns
// Code::kLeaseLost (the records go to the partition's next owner, whose
// Inbox finds the markers of what was committed here).
//
// Long handlers (lease_ms() is 0: a record has no lease of its own, it stays
// this member's while its partition is assigned, and ExtendLease has nothing
// to renew). librdkafka counts Options::max_poll_interval_ms
// (max.poll.interval.ms, default 300 s) from the last poll: a member that
// does not poll for that long leaves the group, its partitions go to
// another member, and it becomes a zombie whose records in flight are
// handled twice. So the source keeps its membership itself
// (Options::keep_alive, on by default): while deliveries are being handled
// and no Receive has polled for a quarter of max_poll_interval_ms (every
// worker of the Consumer inside a handler: with one worker, any handler
// that long), a thread of the source pauses the assigned partitions and
// polls; the records it polled anyway are kept and handed out first by the
// next Receive, which resumes the partitions. Rebalances then run on that
// thread too (the revocation waits for the handlers, as below). The
// heartbeat (session_timeout_ms) is sent by librdkafka's own thread; a
// member that is stopped altogether (SIGSTOP, a crash) stops both and loses
// its partitions after session_timeout_ms. A member that lost a partition
// while a handler of it still ran (paused, or cut off from the brokers but
// not from the database): its late Acks commit nothing (a failed commit,
// counted in stats().commit_errors, or kLeaseLost once the revocation ran),
// and its late effect is settled by the store: the Inbox's marker, or the
// OffsetInbox's claim of the offset (idem/kafka/offset_inbox.h).
//
// Thread safety: Receive, Ack and Nack may be called from many threads at
// once. Receive calls are serialised (one poll at a time); the rebalance
// callbacks, Options::start_offset included, run inside a poll: Receive's,
// the keeper's (keep_alive), or the destructor's.
#ifndef IDEM_KAFKA_SOURCE_H_
#define IDEM_KAFKA_SOURCE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/env.h"
#include "idem/message.h"
#include "idem/publisher.h"
#include "idem/result.h"
#include "idem/source.h"
#include "idem/status.h"

namespace idem::kafka {

// A point-in-time copy of a Source's counters.
struct SourceStats {
  uint64_t delivered = 0;         // deliveries handed out by Receive
  uint64_t held_back = 0;         // records dropped because a seek back was pending
  uint64_t seeks = 0;             // seeks performed for nacks
  uint64_t commits = 0;           // commit requests issued
  uint64_t commit_errors = 0;     // commits that failed (reported by librdkafka)
  uint64_t assignments = 0;       // assignment callbacks (each rebalance adds one)
  uint64_t revocations = 0;       // revocation callbacks
  uint64_t abandoned = 0;         // in-flight deliveries dropped at revocation
  uint64_t keep_alive_polls = 0;  // polls made by the keeper (Options::keep_alive) while handlers ran
};

// The receipt, decoded. Exposed for tests and tools.
struct Receipt {
  std::string topic{};
  int32_t partition = 0;
  int64_t offset = 0;
  uint64_t assignment = 0;
};
std::string EncodeReceipt(const Receipt& r);
// Code::kInvalidArgument when `receipt` was not made by EncodeReceipt.
Result<Receipt> DecodeReceipt(std::string_view receipt);

class Source final : public ::idem::Source {
 public:
  struct Options {
    // Bootstrap brokers, "host:port,host:port". Required.
    std::string brokers{};
    // The topic to consume. Required.
    std::string topic{};
    // The consumer group (group.id). Required.
    std::string group{};
    // The record header that carries the message id. Default: "id".
    std::string id_header = "id";
    // Take the id from the record key when the header is missing.
    // Default: false.
    bool id_from_key = false;
    // client.id, shown in broker logs. Default: "idem".
    std::string client_id = "idem";
    // session.timeout.ms: how long the group waits for a silent member before
    // giving its partitions to others. Default: 10000.
    int64_t session_timeout_ms = 10'000;
    // heartbeat.interval.ms. Default: 1000.
    int64_t heartbeat_interval_ms = 1'000;
    // max.poll.interval.ms: the longest gap between two polls before the
    // member is considered stuck and leaves the group (see "Long handlers"
    // above: with keep_alive a long handler does not make such a gap).
    // Default: 300000.
    int64_t max_poll_interval_ms = 300'000;
    // Keep the membership while handlers run longer than
    // max_poll_interval_ms: a thread of the source polls, with the assigned
    // partitions paused, when deliveries are being handled and nothing
    // polled for a quarter of it (see "Long handlers"). Off: a handler
    // longer than max_poll_interval_ms while no other thread is in Receive
    // makes this member leave the group. Default: true. URL: keep_alive.
    bool keep_alive = true;
    // auto.offset.reset, where a partition with no committed offset starts:
    // "earliest" or "latest". Default: "earliest".
    std::string auto_offset_reset = "earliest";
    // On revocation, how long to wait for the revoked partitions' deliveries
    // still being worked on to be acknowledged or nacked before giving them
    // up (a later Ack of them is then kLeaseLost). 0: do not wait.
    // Default: 5000.
    int64_t revoke_wait_ms = 5'000;
    // Called on assignment for each newly assigned partition: the offset to
    // start from, or nullopt for Kafka's committed offset. Runs inside a poll
    // (Receive's, or the keeper's). Default: none (committed offsets).
    std::function<std::optional<int64_t>(std::string_view topic, int32_t partition)> start_offset{};
    // Extra librdkafka configuration properties, applied last (so they may
    // override the above; enable.auto.commit and enable.auto.offset.store are
    // forced off after them). Default: none.
    std::vector<std::pair<std::string, std::string>> config{};
    // Clock for nack delays. Default: Env::Default().
    Env* env = nullptr;
    // When > 0, Open asks the cluster for its metadata and waits up to this
    // long for a broker to answer; none did: Code::kUnavailable ("cannot
    // connect to Kafka at <brokers>"). 0: the brokers are contacted lazily
    // (an unreachable cluster then shows only as empty Receives, librdkafka
    // retrying forever). Default: 0.
    int64_t connect_timeout_ms = 0;
  };

  // Creates the consumer and subscribes to the topic. Code::kInvalidArgument
  // for a missing or rejected option. Unless Options::connect_timeout_ms is
  // set, the brokers are contacted lazily (an unreachable cluster shows as
  // empty Receives); with it, kUnavailable when no broker answers in time.
  static Result<std::unique_ptr<Source>> Open(const Options& options);
  // Parses "kafka://HOST[:PORT][,HOST[:PORT]...]?topic=T[&group=G][&id_header=H]
  // [&id_from_key=B][&client_id=C][&session_timeout_ms=N]
  // [&heartbeat_interval_ms=N][&max_poll_interval_ms=N]
  // [&auto_offset_reset=earliest|latest][&revoke_wait_ms=N]
  // [&connect_timeout_ms=N][&keep_alive=B]". Options::brokers is the host list. Where the
  // URL says nothing: group "idem"; connect_timeout_ms 5000 (a URL fails
  // fast on an unreachable cluster, where Options' default 0 waits
  // lazily); heartbeat_interval_ms a quarter of session_timeout_ms, within
  // 50..1000. kInvalidArgument for another scheme, no topic, an unknown
  // key or a bad value.
  static Result<Options> ParseUrl(std::string_view url);
  // Leaves the group (the revocation commits acknowledged prefixes) and
  // destroys the consumer.
  ~Source() override;
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override;
  // OK when acknowledged (the commit is issued asynchronously; a failed
  // commit is counted in stats().commit_errors, and the next ack or the
  // revocation commits again). kLeaseLost when the partition was revoked
  // since the delivery. kInvalidArgument for a receipt of another source.
  Status Ack(const Delivery& delivery) override;
  // OK when the seek back is recorded; kLeaseLost as for Ack.
  Status Nack(const Delivery& delivery, int64_t delay_ms) override;
  std::string_view Kind() const override { return "kafka"; }
  // The timestamp of the oldest record the group may still be handed: for
  // each partition, the first record at or after the group's committed
  // offset (where there is no commit yet, where auto_offset_reset starts),
  // read by a short-lived consumer of its own that joins no group; None when
  // every partition is committed to its end. The record's timestamp is the
  // producer's CreateTime unless the topic keeps LogAppendTime. Up to 5 s
  // per broker call; kUnavailable when a record could not be read.
  Result<RedeliveryHorizon> Horizon() override;

  // Commits every acknowledged prefix now and waits for the answer.
  Status CommitSync();
  // The partitions of the topic assigned to this member right now.
  std::vector<int32_t> Assignment() const;
  // This member's id in the group ("" before it joined).
  std::string MemberId() const;
  SourceStats stats() const;

  struct Impl;

 private:
  explicit Source(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct ProduceOptions {
  // The partition, or -1 to let the partitioner pick by key. Default: -1.
  int32_t partition = -1;
  // The record key; nullopt: the message id (so every copy of a message
  // lands in one partition, in order). Default: nullopt.
  std::optional<std::string> key{};
};

// The producer's end of a topic: writes messages as records, payload as
// value, the id in the id header, the message's headers after it, and
// producer_time_ms in the header "idem-producer-time-ms" (decimal ms;
// doc/wire-format.md). Publish waits for the brokers' delivery report;
// Produce and Flush are the batched form (queue many, then wait once).
//
// Thread safety: Publish, Produce and Flush may be called from many threads.
class Publisher final : public ::idem::Publisher {
 public:
  struct Options {
    // Bootstrap brokers, "host:port,...". Required.
    std::string brokers{};
    // The topic Publish and Produce write to. Empty: they are
    // kInvalidArgument, and PublishBatch needs a destination per message.
    std::string topic{};
    // The header that carries the message id. Default: "id".
    std::string id_header = "id";
    // acks: "all", "1" or "0". Default: "all".
    std::string acks = "all";
    // Extra librdkafka properties, applied last. Default: none.
    std::vector<std::pair<std::string, std::string>> config{};
    // As Source::Options::connect_timeout_ms: when > 0, Open fails with
    // Code::kUnavailable unless a broker answers a metadata request within
    // this long. Default: 0 (lazily).
    int64_t connect_timeout_ms = 0;
    // How long Publish waits for the delivery report, in ms (> 0).
    // Default: 30000.
    int64_t publish_timeout_ms = 30'000;
  };

  // kInvalidArgument for a missing or rejected option; with
  // connect_timeout_ms, kUnavailable when no broker answers in time.
  static Result<std::unique_ptr<Publisher>> Open(const Options& options);
  // Reads the URL of Source::ParseUrl (the same URL opens both ends): the
  // brokers, topic, id_header and connect_timeout_ms (5000 where the URL
  // says nothing); the keys only a consumer uses are checked and ignored.
  static Result<Options> ParseUrl(std::string_view url);
  // Flushes (up to 10 s) and destroys the producer.
  ~Publisher() override;
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  // Produce(message) and Flush(publish_timeout_ms): returns once the
  // brokers acknowledged it (acks). An error: it may or may not be written;
  // publish again.
  Status Publish(const Message& message) override;
  // Produces every element as a record (topic: its destination, else
  // Options::topic; record key: its key, else the message id; the headers
  // as Produce writes them, and idem-ordering-key = key when not empty),
  // then flushes and gives each element its own delivery report
  // (kInDoubt for one that did not come within publish_timeout_ms).
  // traits(): ordered_batch when the producer is idempotent (the default:
  // acks=all, enable.idempotence=true unless `config` turns it off), with
  // the partitioner murmur2_random (one key, one partition, as the Java
  // client places it); max_batch 1000. Channel(): Options::topic.
  std::vector<Status> PublishBatch(std::span<const Outgoing> batch) override;
  PublisherTraits traits() const override;
  std::string_view Channel() const override;
  std::string_view Kind() const override { return "kafka"; }

  // Queues one record. kBusy when the local queue is full (Flush, retry).
  Status Produce(const Message& message, const ProduceOptions& options = {});
  // Waits up to `timeout_ms` for every queued record to be acknowledged by
  // the brokers. OK when all were; otherwise the first delivery error since
  // the last Flush (kUnavailable when the wait timed out).
  Status Flush(int64_t timeout_ms = 30'000);

  struct Impl;

 private:
  explicit Publisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::kafka

#endif  // IDEM_KAFKA_SOURCE_H_
