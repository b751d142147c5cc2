// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// A Redis duplicate pre-filter for the Inbox (Inbox::Options::prefilter): one
// round trip tells which messages of a delivery were committed before, so
// that redelivered duplicates are answered without a database transaction.
//
//   auto filter = idem::redis::Prefilter::Open({.url = "redis://cache:6379"});
//   auto inbox = idem::Inbox::Open(*store, {.consumer = "payments", .prefilter = filter->get()});
//
// It is never the only guard (see idem/prefilter.h): a message is remembered
// only after its marker committed, with its payload's fingerprint, and is
// shed only when the stored fingerprint equals the new delivery's. Anything
// else (an unknown id, a reused id with another payload, an evicted or
// flushed key, a Redis that is down or slow) goes to the store, whose marker
// decides. Losing Redis costs speed, never correctness.
//
// The one thing it must not outlive is its database: what it remembers is
// "committed in THAT database". Give each database its own prefix (or Redis
// database), and when a database is recreated or restored from a backup,
// delete the filter's keys (or change the prefix) before consuming again;
// otherwise messages the restored database never applied would be shed.
//
// Keys: <prefix>seen:<consumer length>:<consumer>:<message id>, holding the
// 32-byte fingerprint, set with NX and a TTL of ttl_ms.
//
// Thread safety: safe from many threads; each call takes its own connection
// from a small pool.
#ifndef IDEM_REDIS_PREFILTER_H_
#define IDEM_REDIS_PREFILTER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "idem/prefilter.h"
#include "idem/result.h"
#include "idem/status.h"

namespace idem::redis {

class Prefilter : public DuplicateFilter {
 public:
  struct Options {
    // As for the claim store: "redis://[[user]:password@]host[:port][/db]".
    // Default: "redis://127.0.0.1:6379".
    std::string url = "redis://127.0.0.1:6379";
    // Put before every key. Default: "idem:".
    std::string prefix = "idem:";
    // How long a committed message is remembered, in milliseconds. Any value
    // is safe (what the filter has forgotten goes to the store); longer sheds
    // more late duplicates and costs Redis memory. >= 1. Default: 24 hours.
    int64_t ttl_ms = 24LL * 3600 * 1000;
    // Sent with CLIENT SETNAME (see idem/redis/claim_store.h). Default:
    // "idem-prefilter".
    std::string client_name = "idem-prefilter";
    // Idle connections kept for reuse. >= 1. Default: 8.
    int pool_size = 8;
    // Milliseconds to wait for a connection, > 0; on timeout the filter
    // answers "unknown" and the store decides. Default: 500.
    int connect_timeout_ms = 500;
    // Milliseconds to wait for an answer, > 0; as above. Default: 500.
    int command_timeout_ms = 500;
    // After a failed connection, the filter does not try again for this many
    // milliseconds (it answers "unknown" at once), so a Redis that is down
    // costs each delivery nothing. >= 0. Default: 1000.
    int retry_after_ms = 1'000;
  };

  // Checks the options and the URL; does not connect (Redis being down when
  // the consumer starts costs speed, not the start). Errors:
  // kInvalidArgument (bad URL, a field out of range, naming it).
  static Result<std::unique_ptr<Prefilter>> Open(const Options& options);

  // Reads "redis://...[?k=v&...]" into options as redis::ClaimStore::ParseUrl
  // does; the keys are the fields' names: prefix, ttl_ms, client_name,
  // pool_size, connect_timeout_ms, command_timeout_ms, retry_after_ms.
  static Result<Options> ParseUrl(std::string_view url);

  // Connects (if needed) and sends PING: OK, or why Redis cannot be used
  // (kUnavailable naming host:port, never the password).
  virtual Status Ping() = 0;

 protected:
  Prefilter() = default;
};

}  // namespace idem::redis

#endif  // IDEM_REDIS_PREFILTER_H_
