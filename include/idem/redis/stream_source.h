// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// StreamSource: a Source over a Redis Stream read through a consumer group
// (hiredis). Every handle is one consumer of the group.
//
//   auto src = idem::redis::StreamSource::Open({.url = "redis://127.0.0.1:6379",
//                                               .stream = "orders", .group = "payments"});
//   idem::Consumer consumer(**src, inbox, handler);
//
// The message id is read from a field of the entry (`id_field`), never the
// stream entry id, so a producer that retries an XADD (two entries, one id)
// is caught by the Inbox. A producer writes entries with StreamPublisher
// (idem/redis/stream_publisher.h), or with XADD and these fields
// (doc/wire-format.md):
//   <id_field>              the message id (required; see below)
//   <payload_field>         the body (missing: empty)
//   idem-producer-time-ms   decimal milliseconds since the Unix epoch
//                           (optional; the former name producer_time_ms is
//                           read too)
//   header:<name>           one header each, in order (names may repeat)
// Any other field is delivered as a header under its own name.
//
// Leases: Receive first takes over entries of the group whose lease ran
// out, whoever held them (a crashed or slow consumer): XPENDING IDLE finds
// them, XCLAIM takes them (the exact form of XAUTOCLAIM, see below). Then it
// reads new entries (XREADGROUP ... >). Both happen in one server-side
// script, so an entry is never handed out without its lease. Message.attempt
// is the entry's delivery count in the group's pending list (XPENDING),
// which the Consumer's backoff and dead-letter bookkeeping see. Ack is XACK
// (and XDEL with delete_on_ack); Nack leaves the entry pending and moves its
// lease end to now + delay, so the first Receive after that (by any
// consumer) takes it over, with its delivery count raised.
//
// The lease clock is the Env, not the server: a lease end E is kept as the
// pending entry's delivery time (XCLAIM ... TIME), E - kLeaseClockShiftMs,
// and the script compares E with the Env's now, which Receive passes in
// (the server's TIME, read around XPENDING, turns idle times back into E).
// So leases and nack delays follow a FakeEnv in tests, exactly to the
// millisecond, and nack delays longer than the lease are possible (Redis
// clamps a delivery time in the future). XAUTOCLAIM would read the server's
// clock once more and could end a lease a millisecond early. The cost:
// XPENDING's idle time for an entry leased by idem reads kLeaseClockShiftMs
// plus the time since its lease ran out (less while it is still leased), and
// an entry read into the group by something other than idem (a plain
// XREADGROUP) is not taken over.
//
// Waiting: with the real clock (env is Env::Default()), a Receive that finds
// nothing blocks in Redis (XREAD BLOCK on the stream, which takes nothing)
// for at most poll_ms at a time, and looks for expired leases between; with
// another Env it sleeps through env->SleepMs(poll_ms) instead.
//
// An entry without the id field (or with an invalid id) is delivered with an
// empty id and a header "idem-error" that says why, so a Consumer
// dead-letters it at once and acks it; it is never dropped silently.
//
// Receipts are "<entry id>:<delivery count>:<consumer>": an Ack or Nack of a
// delivery whose entry has been taken over since (or acked) is kLeaseLost,
// from any handle.
//
// ExtendLease (lease_ms() is Options::lease_ms) moves the lease
// end to the Env's now + lease_ms the way a nack moves it: the entry's
// consumer claims it again (XCLAIM ... TIME now + lease_ms -
// kLeaseClockShiftMs, same delivery count), checked and claimed in one
// script, only while the entry is still pending under the receipt's consumer
// with the receipt's delivery count; otherwise kLeaseLost, and the entry is
// left with whoever holds it.
//
// Horizon() is the time part of the oldest entry id the group may still
// deliver: the smallest one pending (delivered, not acknowledged) or the
// first after the group's last-delivered-id (not delivered yet), whichever
// is older. Entry ids made by Redis (XADD *, as StreamPublisher does) carry
// the server's clock; a producer that chooses its own ids chooses the
// horizon too.
//
// Consumer names: a Redis consumer group keeps every consumer name it has
// seen until XGROUP DELCONSUMER. A service should give each process slot a
// stable name (Options::consumer, e.g. "billing-0" .. "billing-3"
// for four replicas): a restarted slot comes back under its old name, and the
// group's consumer list stays as long as the number of slots. At a clean stop
// (Close(), or the destructor) a handle removes its own name from the group,
// but only when nothing is pending under it: DELCONSUMER would drop the
// pending state of its entries, so no Receive would ever take them over. A
// name with pending entries stays; those entries are taken over by any
// consumer once their leases run out, and a handle reusing the name sees them
// pending under it (its ExtendLease, Ack and Nack of their receipts work).
//
// Thread safety: a StreamSource may be used from many threads (a pool of
// connections); many processes may consume one group.
#ifndef IDEM_REDIS_STREAM_SOURCE_H_
#define IDEM_REDIS_STREAM_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "idem/env.h"
#include "idem/message.h"
#include "idem/result.h"
#include "idem/source.h"
#include "idem/status.h"

namespace idem::redis {

// See the header comment. Lease ends are stored as delivery times this far
// in the past (2^36 ms, about 795 days): also the longest nack delay.
inline constexpr int64_t kLeaseClockShiftMs = int64_t{1} << 36;

class StreamSource : public Source {
 public:
  struct Options {
    // "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]", no query. Required.
    std::string url{};
    // The stream's key. Required.
    std::string stream{};
    // The consumer group's name. Required (ParseUrl: "idem" when the URL
    // names none).
    std::string group{};
    // This handle's consumer name in the group. Recommended for services: a
    // stable name per process slot (see "Consumer names" above), which a
    // restart reuses. Default (empty): a new name per handle,
    // "idem-<hostname>-<pid>-<random>", removed from the group at a clean stop
    // with nothing pending (a crashed handle's name stays behind: remove it
    // with XGROUP DELCONSUMER once XPENDING shows nothing under it).
    std::string consumer{};
    // The entry fields that hold the message id and the payload. Neither may
    // be empty, equal to the other, a producer time name or start with
    // "header:". Defaults: "id", "payload".
    std::string id_field = "id";
    std::string payload_field = "payload";
    // How long a received entry stays leased before another Receive (of any
    // consumer of the group) takes it over: the visibility timeout, in ms,
    // 1 .. kLeaseClockShiftMs / 2. Default: 30000.
    int64_t lease_ms = 30'000;
    // Create the group (XGROUP CREATE <stream> <group> 0 MKSTREAM) when it does
    // not exist, at Open and when Redis reports NOGROUP (a flushed server). A
    // new group starts at the beginning of the stream. Default: true.
    bool create_group = true;
    // XDEL an entry after XACK (only when this group is the stream's only
    // reader). Default: false (trim the stream with XTRIM/MAXLEN instead).
    bool delete_on_ack = false;
    // Longest single wait inside Receive, in ms; lease expiries are noticed
    // at least this often (values below 1 are taken as 1). Default: 100.
    int64_t poll_ms = 100;
    // Idle connections kept for reuse (values below 1 are taken as 1).
    // Default: 8.
    int pool_size = 8;
    // How long to wait for a connection, in ms (> 0). Default: 5000.
    int64_t connect_timeout_ms = 5'000;
    // The clock for leases and nack delays; it must read ms since the Unix
    // epoch. Default (nullptr): Env::Default().
    Env* env = nullptr;
  };

  // Connects and (with create_group) creates the group. Errors:
  // kInvalidArgument (bad URL, empty stream/group/field names, lease_ms < 1,
  // connect_timeout_ms < 1, an Env clock before 1972), kUnavailable naming
  // host:port (unreachable, wrong password: never echoed), kNotFound (no
  // group and create_group off).
  static Result<std::unique_ptr<StreamSource>> Open(const Options& options);
  // Parses "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]?stream=S[&group=G]
  // [&consumer=C][&id_field=F][&payload_field=F][&lease_ms=N][&create_group=B]
  // [&delete_on_ack=B][&poll_ms=N][&pool_size=N][&connect_timeout_ms=N]":
  // Options::url is the URL without its query. kInvalidArgument for another
  // scheme, a bad URL, no stream, an unknown key or a bad value.
  static Result<Options> ParseUrl(std::string_view url);

  // Appends a message to the stream, as StreamPublisher::Append does, and
  // returns the entry id. kInvalidArgument for an invalid message id.
  virtual Result<std::string> Publish(const Message& message) = 0;
  // This handle's consumer name in the group.
  virtual const std::string& consumer() const = 0;
  // A clean stop: removes this handle's consumer name from the group
  // (XGROUP DELCONSUMER) when no entry is pending under it, checked and
  // removed in one script; with entries pending it leaves the name (and
  // them) in place. Both are OK. A group or stream that no longer exists is
  // OK (nothing to remove). kUnavailable when the server cannot be reached.
  // The destructor does the same (ignoring errors) unless Close() succeeded
  // and no Receive ran since. The handle stays usable: a later Receive
  // enters the name in the group again.
  virtual Status Close() = 0;
  std::string_view Kind() const override { return "redis-streams"; }
};

}  // namespace idem::redis

#endif  // IDEM_REDIS_STREAM_SOURCE_H_
