// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The embedded queue: a small durable at-least-once broker in its own SQLite
// file. It is deliberately a separate file from the consumer's database, so an
// acknowledgement can never ride inside the business transaction: like any
// broker, it can lose an ack and deliver again.
//
// Publish appends (a producer may publish the same fact twice: both copies are
// delivered). Receive leases messages for lease_ms; Ack deletes; Nack makes a
// message visible again after a delay; a lease that expires makes the message
// visible to the next Receive, with its delivery count raised. lease_ms()
// is Options::lease_ms; ExtendLease moves the delivery's lease end to
// now + lease_ms (on the Env's clock) while its receipt still holds the
// lease (also when the lease ran out but nobody received the message since),
// and is kLeaseLost once it was received again or acked, as Ack and Nack are.
// Horizon() is the enqueue time (the Env's, at Publish) of the queue's
// oldest message still in it: every message not acknowledged (leased,
// nacked, ready), since an Ack deletes it.
//
// Thread safety: a Queue may be used from many threads; many processes may
// open the same file.
#ifndef IDEM_EMBEDDED_QUEUE_H_
#define IDEM_EMBEDDED_QUEUE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "idem/env.h"
#include "idem/message.h"
#include "idem/publisher.h"
#include "idem/result.h"
#include "idem/source.h"

namespace idem::embedded {

struct QueueStats {
  int64_t ready = 0;      // visible now
  int64_t leased = 0;     // received, lease not expired, not acked
  int64_t delayed = 0;    // nacked with a delay still running
  int64_t published = 0;  // ever published to this queue
  int64_t acked = 0;      // ever acknowledged
};

// The queue is both ends: a Source for consumers and a Publisher for
// producers (Publish appends; it returns once the append is committed).
class Queue : public Source, public Publisher {
 public:
  struct Options {
    // The queue's file. Its directory must exist. Required.
    std::string path{};
    // The queue's name inside the file (several queues may share one file).
    // Default: "default".
    std::string queue = "default";
    // How long a received message stays invisible to others before it is
    // delivered again (the visibility timeout), in ms, >= 1. Default: 30000.
    int64_t lease_ms = 30'000;
    // Sync every publish/ack to disk (SQLite synchronous=FULL; NORMAL when
    // false). Default: true.
    bool durable = true;
    // Wait for the file lock up to this long (ms, >= 0) before kBusy.
    // Default: 10000.
    int64_t busy_timeout_ms = 10'000;
    // How often a waiting Receive looks again, in ms (values below 1 are
    // taken as 1). Default: 10.
    int64_t poll_ms = 10;
    // The clock for leases and nack delays. Default (nullptr): Env::Default().
    Env* env = nullptr;
    // The SQLite VFS to open the file through, as idem::sqlite::Options::vfs
    // ("idem-fault" for fault injection in tests). Default (empty): SQLite's
    // default.
    std::string vfs{};
  };

  // kInvalidArgument naming the field for an empty path or queue, lease_ms
  // < 1 or busy_timeout_ms < 0; otherwise errors as for idem::sqlite::Store::Open;
  // kSchemaMismatch for a file that holds another schema (not a queue file,
  // or a newer version).
  static Result<std::unique_ptr<Queue>> Open(const Options& options);
  // Parses "embedded:PATH[?queue=NAME&lease_ms=N&durable=B&busy_timeout_ms=N&poll_ms=N&vfs=NAME]"
  // (also "embedded://PATH"). kInvalidArgument for another scheme, no path,
  // an unknown key, a key given twice, a value that is not of its kind.
  static Result<Options> ParseUrl(std::string_view url);

  // Appends a message. Its id is validated; the payload is stored as is.
  Status Publish(const Message& message) override = 0;
  // Appends every message in one write transaction: all are stored or none
  // (every element then answers the same error). Destination: the name of a
  // queue in this queue's file (empty: Options::queue); a key goes into the
  // headers as kOrderingKeyHeader. An element with an invalid id or no
  // message answers kInvalidArgument and is left out; the others are
  // stored. traits(): ordered_batch, max_batch 1000. Channel():
  // Options::queue.
  std::vector<Status> PublishBatch(std::span<const Outgoing> batch) override = 0;
  virtual Result<QueueStats> Stats() = 0;
  std::string_view Kind() const override { return "embedded"; }
};

}  // namespace idem::embedded

#endif  // IDEM_EMBEDDED_QUEUE_H_
