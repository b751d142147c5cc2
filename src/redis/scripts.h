// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: the Lua scripts of the Redis claim store. Each claim write is one
// script, so it is atomic on the server: no other command runs between its
// read and its write. (TryClaim first tries SET ... NX GET, see
// claim_store.cc, and runs its script only to take over, or to claim a
// released or expired record.)
//
// A record is one string (one GET reads it, one SET ... PX writes it and its
// TTL; every redis.call costs ~1 us of Lua glue):
//   byte 1      st: 'p' (in progress), 'c' (completed) or 'r' (released: a
//               tombstone kept kReleasedTtlMs so that a claim right after a
//               release goes through kTryClaim and its draw, see
//               NextFence in claim_store.cc)
//   byte 2      err: '1' when the result is a stored error, else '0'
//   byte 3      w: '1' once a bounded wait watches the key (Complete and
//               Release then PUBLISH on its channel), else '0'
//   bytes 4-35  the 32-byte fingerprint
//   then        "<fence>:<lease>:<exp>:<upd>:" in decimal (ms, store clock;
//               exp: retention end of a completed record, else 0)
//   then        the result (any bytes, to the end)
// The C++ side reads and writes the same layout (RecordCodec in
// claim_store.cc).
//
// ARGV[1] of the scripts that read the clock is the caller's `now` in ms, or
// "" to use the server's TIME (allowed before writes since Redis 5: scripts
// replicate their effects, not their code).
#ifndef IDEM_SRC_REDIS_SCRIPTS_H_
#define IDEM_SRC_REDIS_SCRIPTS_H_

#include "redis/client.h"

namespace idem::redis_internal {

// How long a released claim's tombstone stays.
inline constexpr int64_t kReleasedTtlMs = 2'000;

#define IDEM_REDIS_LUA_NOW                                              \
  "local now\n"                                                         \
  "if ARGV[1] ~= '' then now = tonumber(ARGV[1]) else\n"                \
  "  local t = redis.call('TIME')\n"                                    \
  "  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n" \
  "end\n"

// Draws from a fencing counter: draw(counter, n, above) moves it to
// max(counter, the server's TIME in microseconds, above) + n and returns the
// new value, so the caller owns the n tokens up to it. Seeded from the clock,
// a counter that was lost (a restart without persistence, FLUSHALL) or that
// went back (a replica promoted before it had the latest value) starts above
// every token drawn before, as long as the counter never ran ahead of the
// clock: fewer than one token per microsecond on average (a block counts as
// its size), and a server clock that does not step back. `above` is the fence
// of the record the caller replaces, so even then the key's new holder
// outranks the record's. Microseconds since the epoch stay exact in Lua's
// doubles (below 2^53) until the year 2255; written with %.0f, as a plain
// integer INCR would still read.
#define IDEM_REDIS_LUA_DRAW                                    \
  "local function draw(counter, n, above)\n"                   \
  "  local t = redis.call('TIME')\n"                           \
  "  local top = tonumber(t[1]) * 1000000 + tonumber(t[2])\n"  \
  "  local c = tonumber(redis.call('GET', counter) or '')\n"   \
  "  if c and c > top then top = c end\n"                      \
  "  if above and above > top then top = above end\n"          \
  "  top = top + n\n"                                          \
  "  redis.call('SET', counter, string.format('%.0f', top))\n" \
  "  return top\n"                                             \
  "end\n"

// Splits the record `v` (a string) into st, fence, lease, exp, upd (strings)
// and the position of the result; fence is nil when `v` is not idem's.
#define IDEM_REDIS_LUA_SPLIT                                                      \
  "local function split(v)\n"                                                     \
  "  local st = string.sub(v, 1, 1)\n"                                            \
  "  if (st ~= 'p' and st ~= 'c' and st ~= 'r') or #v < 35 then return st end\n"  \
  "  return st, string.match(v, '^(%-?%d+):(%-?%d+):(%-?%d+):(%-?%d+):()', 36)\n" \
  "end\n"

// The same inline, as locals (a function defined on every call costs the
// server more than the match itself): st, fence, lease, exp, upd, pos.
#define IDEM_REDIS_LUA_SPLIT_V                                                                       \
  "local st = string.sub(v, 1, 1)\n"                                                                 \
  "local fence, lease, exp, upd, pos\n"                                                              \
  "if (st == 'p' or st == 'c' or st == 'r') and #v >= 35 then\n"                                     \
  "  fence, lease, exp, upd, pos = string.match(v, '^(%-?%d+):(%-?%d+):(%-?%d+):(%-?%d+):()', 36)\n" \
  "end\n"

// Reads the record and checks the token (ARGV[2]): returns {'lost', fence
// or 0, state or ''} when it does not match; else leaves v, st, fence,
// lease, exp, upd, pos.
#define IDEM_REDIS_LUA_CHECK_TOKEN                                    \
  "local v = redis.call('GET', KEYS[1])\n"                            \
  "if not v then return {'lost', 0, ''} end\n" IDEM_REDIS_LUA_SPLIT_V \
  "if not fence then return {'lost', 0, st} end\n"                    \
  "if tonumber(fence) ~= tonumber(ARGV[2]) then return {'lost', tonumber(fence), st} end\n"

// KEYS: record, fence counter. ARGV: now, fingerprint, lease_ms,
// abandon_margin_ms. The new fence is drawn above the counter, the clock
// and the fence of the record it replaces (see draw). Returns {'started', fence, lease_until, took_over 0|1},
// {'conflict', stored fp}, {'completed', result, is_error 0|1},
// {'in_progress', lease_until} or {'corrupt', state}.
inline constexpr Script kTryClaim{
    "try_claim", IDEM_REDIS_LUA_NOW IDEM_REDIS_LUA_DRAW
    "local v = redis.call('GET', KEYS[1])\n"
    "local took_over = 0\n"
    "local w = '0'\n"
    "local above = 0\n"
    "if v then\n" IDEM_REDIS_LUA_SPLIT_V
    "  if not fence then return {'corrupt', st} end\n"
    "  w = string.sub(v, 3, 3)\n"
    "  above = tonumber(fence)\n"
    // Present, unless released, or completed and past its retention (TTL
    // may lag a caller's clock).
    "  if st ~= 'r' and not (st == 'c' and tonumber(exp) <= now) then\n"
    "    local fp = string.sub(v, 4, 35)\n"
    "    if fp ~= ARGV[2] then return {'conflict', fp} end\n"
    "    if st == 'c' then return {'completed', string.sub(v, pos), string.sub(v, 2, 2) == '1' and 1 or 0} end\n"
    "    local held = tonumber(lease)\n"
    "    if held > now then return {'in_progress', held} end\n"
    "    took_over = 1\n"
    "  end\n"
    "end\n"
    "local fence = draw(KEYS[2], 1, above)\n"
    "local span = tonumber(ARGV[3])\n"
    "local lease = now + span\n"
    // A record being replaced leaves no stale result behind; a watcher's
    // mark stays. Relative TTL: with a caller's clock, absolute times need
    // not be the server's.
    "redis.call('SET', KEYS[1], 'p0' .. w .. ARGV[2] .. string.format('%.0f:%.0f:0:%.0f:', fence, lease, now),\n"
    "           'PX', span + tonumber(ARGV[4]))\n"
    "return {'started', fence, lease, took_over}\n"};

// KEYS: the fence counter. ARGV: how many tokens.
// Reserves a block of them (see draw) and returns its last one.
inline constexpr Script kReserveFences{"reserve_fences",
                                       IDEM_REDIS_LUA_DRAW "return draw(KEYS[1], tonumber(ARGV[1]), 0)\n"};

// KEYS: records. ARGV: now, retention_ms, min_ttl_ms, then for each record
// (four each): fence, result, is_error '0'|'1', channel. Completes each
// record whose fence matches (one script for a batch: its cost is mostly
// per call, not per record). Returns one reply per record: {'ok'} or the
// token check's {'lost', fence, st}.
inline constexpr Script kComplete{
    "complete",
    IDEM_REDIS_LUA_NOW
    "local keep = tonumber(ARGV[2])\n"
    "local ttl = math.max(keep, tonumber(ARGV[3]))\n"
    "local function complete(key, want, result, is_error, channel)\n"
    "  local v = redis.call('GET', key)\n"
    "  if not v then return {'lost', 0, ''} end\n" IDEM_REDIS_LUA_SPLIT_V
    "  if not fence then return {'lost', 0, st} end\n"
    "  if tonumber(fence) ~= tonumber(want) then return {'lost', tonumber(fence), st} end\n"
    "  if st == 'r' then return {'lost', tonumber(fence), st} end\n"
    "  if st == 'c' then return {'ok'} end\n"  // a retried Complete
    "  redis.call('SET', key, 'c' .. is_error .. string.sub(v, 3, 35) ..\n"
    "             string.format('%s:%s:%.0f:%.0f:', fence, lease, now + keep, now) .. result, 'PX', ttl)\n"
    "  if string.sub(v, 3, 3) == '1' then redis.call('PUBLISH', channel, 'completed') end\n"
    "  return {'ok'}\n"
    "end\n"
    "local out = {}\n"
    "for i = 1, #KEYS do\n"
    "  local a = 3 + (i - 1) * 4\n"
    "  out[i] = complete(KEYS[i], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4])\n"
    "end\n"
    "return out\n"};

// KEYS: record. ARGV: unused, fence, channel, tombstone TTL ms. Returns
// {'ok'} or {'lost', ...}. Leaves a tombstone ('r', same fence) for the TTL.
inline constexpr Script kRelease{
    "release", IDEM_REDIS_LUA_CHECK_TOKEN
    "if st ~= 'p' then return {'lost', tonumber(fence), st} end\n"
    "redis.call('SET', KEYS[1], 'r00' .. string.sub(v, 4, 35) .. fence .. ':0:0:0:', 'PX', tonumber(ARGV[4]))\n"
    "if string.sub(v, 3, 3) == '1' then redis.call('PUBLISH', ARGV[3], 'released') end\n"
    "return {'ok'}\n"};

// KEYS: record. ARGV: now, fence, lease_ms, abandon_margin_ms. Returns
// {'ok', lease_until} or {'lost', ...}.
inline constexpr Script kExtend{
    "extend", IDEM_REDIS_LUA_NOW IDEM_REDIS_LUA_CHECK_TOKEN
    "if st ~= 'p' then return {'lost', tonumber(fence), st} end\n"
    "local span = tonumber(ARGV[3])\n"
    "local until_ms = now + span\n"
    "redis.call('SET', KEYS[1], string.sub(v, 1, 35) ..\n"
    "           string.format('%s:%.0f:%s:%.0f:', fence, until_ms, exp, now) .. string.sub(v, pos),\n"
    "           'PX', span + tonumber(ARGV[4]))\n"
    "return {'ok', until_ms}\n"};

// KEYS: record. Marks the record as watched (byte 3), keeping its TTL, so
// that its Complete or Release publishes. No record: nothing to mark (the
// waiter's polls cover a claim made after this). Returns 1.
inline constexpr Script kAddWaiter{
    "add_waiter",
    "local v = redis.call('GET', KEYS[1])\n"
    "if v and #v >= 3 and string.sub(v, 3, 3) ~= '1' then\n"
    "  redis.call('SET', KEYS[1], string.sub(v, 1, 2) .. '1' .. string.sub(v, 4), 'KEEPTTL')\n"
    "end\n"
    "return 1\n"};

// KEYS: records found by SCAN. ARGV: now, abandoned_after_ms. Deletes the
// completed ones past their retention and the in-progress ones abandoned
// for abandoned_after_ms past their lease; returns how many. Keys that are
// not idem's records are left alone.
inline constexpr Script kPurge{"purge", IDEM_REDIS_LUA_NOW IDEM_REDIS_LUA_SPLIT
                               "local after = tonumber(ARGV[2])\n"
                               "local n = 0\n"
                               "for _, k in ipairs(KEYS) do\n"
                               "  local v = redis.pcall('GET', k)\n"
                               "  if type(v) == 'string' then\n"
                               "    local st, fence, lease, exp = split(v)\n"
                               "    if fence and ((st == 'c' and tonumber(exp) <= now) or\n"
                               "                  (st == 'p' and tonumber(lease) + after <= now)) then\n"
                               "      redis.call('DEL', k)\n"
                               "      n = n + 1\n"
                               "    end\n"
                               "  end\n"
                               "end\n"
                               "return n\n"};

#undef IDEM_REDIS_LUA_NOW
#undef IDEM_REDIS_LUA_DRAW
#undef IDEM_REDIS_LUA_SPLIT
#undef IDEM_REDIS_LUA_SPLIT_V
#undef IDEM_REDIS_LUA_CHECK_TOKEN

}  // namespace idem::redis_internal

#endif  // IDEM_SRC_REDIS_SCRIPTS_H_
