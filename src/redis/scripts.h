// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: the Lua scripts of the Redis claim store. Each claim operation is
// one script, so it is atomic on the server: no other command runs between
// its read and its write.
//
// A record is a hash with the fields
//   st     'p' (in progress) or 'c' (completed)
//   fp     the 32-byte fingerprint
//   fence  the fencing token (from INCR on the counter key)
//   lease  lease end, ms (store clock)
//   exp    retention end of a completed record, ms
//   res    the result; err '1' when it is a stored error
//   upd    last change, ms
//
// ARGV[1] of the scripts that read the clock is the caller's `now` in ms, or
// "" to use the server's TIME (allowed before writes since Redis 5: scripts
// replicate their effects, not their code). Numbers are stored as Lua
// writes them (%.17g: exact integers for every ms timestamp).
#ifndef IDEM_SRC_REDIS_SCRIPTS_H_
#define IDEM_SRC_REDIS_SCRIPTS_H_

#include "redis/client.h"

namespace idem::redis_internal {

#define IDEM_REDIS_LUA_NOW                                                     \
  "local now\n"                                                                \
  "if ARGV[1] ~= '' then now = tonumber(ARGV[1]) else\n"                       \
  "  local t = redis.call('TIME')\n"                                           \
  "  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"        \
  "end\n"

// Returns the record's fence and state when it does not match the token:
// {'lost', fence or 0, state or ''}.
#define IDEM_REDIS_LUA_CHECK_TOKEN                                             \
  "local r = redis.call('HMGET', KEYS[1], 'st', 'fence')\n"                    \
  "if not r[1] then return {'lost', 0, ''} end\n"                              \
  "local fence = tonumber(r[2]) or 0\n"                                        \
  "if fence ~= tonumber(ARGV[2]) then return {'lost', fence, r[1]} end\n"

// KEYS: record, fence counter. ARGV: now, fingerprint, lease_ms,
// abandon_margin_ms. Returns {'started', fence, lease_until, took_over 0|1},
// {'conflict', stored fp}, {'completed', result, is_error 0|1},
// {'in_progress', lease_until} or {'corrupt', state}.
inline constexpr Script kTryClaim{"try_claim",
    IDEM_REDIS_LUA_NOW
    "local r = redis.call('HMGET', KEYS[1], 'st', 'fp', 'lease', 'exp', 'res', 'err')\n"
    "local st = r[1]\n"
    "local took_over = 0\n"
    // Present, unless completed and past its retention (TTL may lag a caller's clock).
    "if st and not (st == 'c' and (tonumber(r[4]) or 0) <= now) then\n"
    "  if st ~= 'p' and st ~= 'c' then return {'corrupt', st} end\n"
    "  if r[2] ~= ARGV[2] then return {'conflict', r[2] or ''} end\n"
    "  if st == 'c' then return {'completed', r[5] or '', tonumber(r[6]) or 0} end\n"
    "  local held = tonumber(r[3]) or 0\n"
    "  if held > now then return {'in_progress', held} end\n"
    "  took_over = 1\n"
    "end\n"
    // Start: every redis.call costs ~1 us of Lua glue, so no more than needed.
    "local fence = redis.call('INCR', KEYS[2])\n"
    "local span = tonumber(ARGV[3])\n"
    "local lease = now + span\n"
    // A record being replaced leaves no stale result behind.
    "if st then redis.call('DEL', KEYS[1]) end\n"
    "redis.call('HSET', KEYS[1], 'st', 'p', 'fp', ARGV[2], 'fence', fence, 'lease', lease,\n"
    "           'exp', 0, 'err', 0, 'upd', now)\n"
    // Relative TTL: with a caller's clock, absolute times need not be the server's.
    "redis.call('PEXPIRE', KEYS[1], span + tonumber(ARGV[4]))\n"
    "return {'started', fence, lease, took_over}\n"};

// KEYS: record. ARGV: now, fence, result, is_error '0'|'1', retention_ms,
// channel, min_ttl_ms. Returns {'ok'} or the token check's {'lost', ...}.
inline constexpr Script kComplete{"complete",
    IDEM_REDIS_LUA_NOW
    IDEM_REDIS_LUA_CHECK_TOKEN
    "if r[1] == 'c' then return {'ok'} end\n"  // a retried Complete
    "if r[1] ~= 'p' then return {'lost', fence, r[1]} end\n"
    "redis.call('HSET', KEYS[1], 'st', 'c', 'res', ARGV[3], 'err', ARGV[4],\n"
    "           'exp', now + tonumber(ARGV[5]), 'upd', now)\n"
    "redis.call('PEXPIRE', KEYS[1], math.max(tonumber(ARGV[5]), tonumber(ARGV[7])))\n"
    "redis.call('PUBLISH', ARGV[6], 'completed')\n"
    "return {'ok'}\n"};

// KEYS: record. ARGV: unused, fence, channel. Returns {'ok'} or {'lost', ...}.
inline constexpr Script kRelease{"release",
    IDEM_REDIS_LUA_CHECK_TOKEN
    "if r[1] ~= 'p' then return {'lost', fence, r[1]} end\n"
    "redis.call('DEL', KEYS[1])\n"
    "redis.call('PUBLISH', ARGV[3], 'released')\n"
    "return {'ok'}\n"};

// KEYS: record. ARGV: now, fence, lease_ms, abandon_margin_ms. Returns
// {'ok', lease_until} or {'lost', ...}.
inline constexpr Script kExtend{"extend",
    IDEM_REDIS_LUA_NOW
    IDEM_REDIS_LUA_CHECK_TOKEN
    "if r[1] ~= 'p' then return {'lost', fence, r[1]} end\n"
    "local lease = now + tonumber(ARGV[3])\n"
    "redis.call('HSET', KEYS[1], 'lease', lease, 'upd', now)\n"
    "redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]) + tonumber(ARGV[4]))\n"
    "return {'ok', lease}\n"};

// KEYS: records found by SCAN. ARGV: now, abandoned_after_ms. Deletes the
// completed ones past their retention and the in-progress ones abandoned
// for abandoned_after_ms past their lease; returns how many.
inline constexpr Script kPurge{"purge",
    IDEM_REDIS_LUA_NOW
    "local after = tonumber(ARGV[2])\n"
    "local n = 0\n"
    "for _, k in ipairs(KEYS) do\n"
    "  local r = redis.call('HMGET', k, 'st', 'lease', 'exp')\n"
    "  if (r[1] == 'c' and (tonumber(r[3]) or 0) <= now) or\n"
    "     (r[1] == 'p' and (tonumber(r[2]) or 0) + after <= now) then\n"
    "    redis.call('DEL', k)\n"
    "    n = n + 1\n"
    "  end\n"
    "end\n"
    "return n\n"};

#undef IDEM_REDIS_LUA_NOW
#undef IDEM_REDIS_LUA_CHECK_TOKEN

}  // namespace idem::redis_internal

#endif  // IDEM_SRC_REDIS_SCRIPTS_H_
