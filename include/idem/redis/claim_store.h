// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The Redis claim store: the two-phase "claims" mode (idem/claims.h) kept in
// one Redis server (hiredis; tested on Redis 7.0). Every operation is one
// atomic server command: a new key is claimed with one SET ... NX GET (Redis
// 7.0+; older servers get the script instead), which also reads the record
// when the key exists (replays, conflicts, keys in progress are answered from
// it); takeovers, completions, releases and extensions are Lua scripts.
// Leases and expiry are judged by the server's clock (TIME) unless
// ClaimStore::Options::clock is set; a new key's lease starts at this process's estimate
// of the server's clock (the last TIME reply carried forward on the steady
// clock; every claim refreshes it), off by at most a round trip.
//
// Fencing tokens: a new key takes its token from a block of 1,000 that the
// store instance reserved on the shared counter at most 1 s before; a
// takeover's script draws past every reserved block and past the fence of
// the record it replaces. A released claim leaves a tombstone for 2 s, so a
// claim right after a release goes through the script too. So for every
// key, each new holder's token is higher than every earlier holder's;
// across keys and processes tokens are unique but not handed out in one
// global order. Every draw moves the counter to at least the server's clock
// in microseconds since the epoch (TIME), so a counter that was lost (a
// restart without persistence, FLUSHALL) or went back (a failover to a
// replica that lagged) resumes above every token handed out before, and a
// paused holder's old token cannot equal a new holder's. That assumes the
// counter never ran ahead of the clock (on average fewer than one token per
// microsecond; a busy instance takes a block of 1,000 each second, or each
// lease when leases are shorter) and a server clock that does not step back.
//
//   auto store = idem::redis::ClaimStore::Open({.url = "redis://127.0.0.1:6379/0"});
//   if (!store.ok()) return store.status();
//   auto claims = idem::Claims::Open(**store);
//
// What it is and is not:
//   - Not atomic with your database. The claim lives in Redis; the effect
//     lives in your database (or at a provider). Claims guard work that no
//     local transaction covers (a payment call, an HTTP API) and that carries
//     its own idempotency key downstream; for a SQL write, use the Inbox,
//     whose marker commits with the write.
//   - As durable as the server is configured to be. With appendonly yes and
//     appendfsync everysec a crash of the machine can lose about a second of
//     claims and completions; appendfsync always loses none; without AOF
//     (RDB snapshots only, or no persistence) a restart can forget every
//     claim since the last snapshot, and a forgotten completion means the
//     work may run again. Those settings are the operator's; idem does not
//     change them. A failover to a replica can likewise lose the last writes
//     (replication is asynchronous).
//   - One server or a primary, not Redis Cluster: the fencing counter and
//     the records are assumed to live in one keyspace (one slot); a cluster
//     answers MOVED/CROSSSLOT, reported as Code::kInvalidArgument.
//
// Key layout (binary-safe: scope and key may hold any bytes):
//   <prefix>claim:<scope length>:<scope>:<key>   a string: the record (state,
//                                                error and waiter flags, the
//                                                fingerprint, then
//                                                "fence:lease:exp:upd:" and
//                                                the result bytes), written
//                                                with one SET ... PX
//   <prefix>fence                                the fencing counter (an
//                                                integer; the scripts move
//                                                it, never below TIME in us)
//   <prefix>changed:<scope length>:<scope>:<key> the channel a Complete or
//                                                Release publishes on, when
//                                                a waiter flagged the record
// (Records written as hashes by earlier builds are reported as
// Code::kCorruption: flush them.)
// Completed records expire (PX) when their retention ends; in-progress
// records expire abandon_margin_ms after their lease, so abandoned claims do
// not pile up even if PurgeClaims never runs. ListClaims and PurgeClaims
// walk the keyspace with SCAN: tools for inspection and maintenance, not for
// a hot path.
//
// Bounded waits (ClaimRequest::wait_ms) subscribe to the key's channel on a
// connection of their own and flag the record, so a Complete or Release from
// any process wakes them (unflagged records publish nothing).
//
// Concurrent calls are pipelined over two shared connections.
//
// Thread safety: safe from many threads.
#ifndef IDEM_REDIS_CLAIM_STORE_H_
#define IDEM_REDIS_CLAIM_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "idem/claim_store.h"
#include "idem/env.h"
#include "idem/result.h"

namespace idem::redis {

// A ClaimStore in Redis (see the top of this file).
class ClaimStore : public idem::ClaimStore {
 public:
  struct Options {
    // Where to connect: "redis://[[user]:password@]host[:port][/db]". The
    // password (and user, for a Redis 6 ACL user) is sent with AUTH, the
    // database number with SELECT; ':' and '@' in them may be written %3A and
    // %40. TLS (rediss://) is not supported. No query: the other fields are
    // ParseUrl's keys. Default: "redis://127.0.0.1:6379".
    std::string url = "redis://127.0.0.1:6379";
    // Put before every key and channel name, so several applications (or
    // tests) can share one database. Default: "idem:".
    std::string prefix = "idem:";
    // Idle connections kept for reuse. More are opened under load and closed
    // when returned. >= 1. Default: 8.
    int pool_size = 8;
    // Milliseconds to wait for a connection before Code::kUnavailable, > 0.
    // Default: 5000.
    int connect_timeout_ms = 5'000;
    // Milliseconds to wait for an answer before Code::kUnavailable (the
    // command may or may not have run; every operation is safe to retry).
    // > 0. Default: 5000.
    int command_timeout_ms = 5'000;
    // Sent with CLIENT SETNAME, so CLIENT LIST shows whose connections these
    // are. Letters, digits and punctuation, no spaces; "" sends none.
    // Default: "idem".
    std::string client_name = "idem";
    // How long an in-progress record outlives its lease before Redis deletes
    // it on its own (an abandoned claim). >= 0. Default: 24 hours.
    int64_t abandon_margin_ms = 24LL * 3600 * 1000;
    // The clock the scripts judge leases and expiry by. Default (nullptr): the
    // Redis server's (TIME), which every client shares. Tests pass a FakeEnv;
    // key TTLs then still run on the server's clock, so an expired record may
    // linger until PurgeClaims, but it is treated as expired at once.
    Env* clock = nullptr;
  };

  // Checks the options, connects (AUTH, SELECT) and loads the scripts.
  // Errors: kInvalidArgument (bad URL or options, naming the field; no such
  // database), kUnavailable (unreachable server, wrong password: the message
  // names host:port and never the password).
  static Result<std::unique_ptr<ClaimStore>> Open(const Options& options);

  // Reads "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB][?k=v&...]" into
  // options (idem/url.h's grammar): `url` without its query, and the query
  // keys are the fields' names: prefix, pool_size, connect_timeout_ms,
  // command_timeout_ms, client_name, abandon_margin_ms. An unknown key, or
  // one given twice: kInvalidArgument naming it.
  static Result<Options> ParseUrl(std::string_view url);

 protected:
  ClaimStore() = default;
};

}  // namespace idem::redis

#endif  // IDEM_REDIS_CLAIM_STORE_H_
