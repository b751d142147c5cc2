// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::redis::StreamSource: a consumer group of a Redis Stream as a Source.
// The lease bookkeeping is in include/idem/redis/stream_source.h; the hiredis
// connection, its pool and the error translation are src/redis/client.h's.
#include "idem/redis/stream_source.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/options_check.h"
#include "core/wire_format.h"
#include "idem/url.h"
#include "redis/client.h"
#include "redis/stream_wire.h"

namespace idem::redis_internal {

Message DecodeEntry(const std::string& entry_id, const redisReply* fields, const StreamEntryFields& f) {
  Message m;
  bool has_id = false, has_payload = false;
  wire_internal::ProducerTimeReader time;
  for (size_t k = 0; k + 1 < fields->elements; k += 2) {
    std::string_view name = ReplyString(fields->element[k]);
    std::string_view value = ReplyString(fields->element[k + 1]);
    if (!has_id && name == f.id_field) {
      m.id = std::string(value);
      has_id = true;
    } else if (!has_payload && name == f.payload_field) {
      m.payload = std::string(value);
      has_payload = true;
    } else if (wire_internal::ProducerTimeRank(name) >= 0 && wire_internal::ParseProducerTime(value)) {
      time.Offer(name, value);
    } else if (name.starts_with(kStreamHeaderPrefix)) {
      m.headers.emplace_back(std::string(name.substr(kStreamHeaderPrefix.size())), std::string(value));
    } else {
      m.headers.emplace_back(std::string(name), std::string(value));
    }
  }
  m.producer_time_ms = time.time();
  if (!has_id) {
    // An invalid id: the Consumer dead-letters the delivery at once.
    m.id.clear();
    m.headers.emplace_back(std::string(kStreamErrorHeader), "stream entry " + entry_id + " of " +
                                                                std::string(f.stream) + " has no field '" +
                                                                std::string(f.id_field) + "' (the message id)");
  }
  return m;
}

Result<std::vector<Delivery>> DecodeReceiveReply(const redisReply* rep, const StreamEntryFields& f, std::string* last) {
  auto bad = [&](std::string_view what) {
    return Status::Internal("receive from " + std::string(f.where) + ": unexpected reply (" + std::string(what) + ")");
  };
  if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 || rep->element[0]->type != REDIS_REPLY_ARRAY)
    return bad("shape");
  *last = std::string(ReplyString(rep->element[1]));
  std::vector<Delivery> out;
  const redisReply* entries = rep->element[0];
  out.reserve(entries->elements);
  for (size_t i = 0; i < entries->elements; ++i) {
    const redisReply* e = entries->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements != 3 || e->element[2]->type != REDIS_REPLY_ARRAY)
      return bad("entry");
    const std::string entry_id(ReplyString(e->element[0]));
    IDEM_ASSIGN_OR_RETURN(int64_t count, ReplyInt(e->element[1], "delivery count"));
    Delivery d;
    d.message = DecodeEntry(entry_id, e->element[2], f);
    d.message.attempt = static_cast<int>(std::min<int64_t>(count, 1 << 30));
    d.receipt = entry_id + ":" + std::to_string(count) + ":" + std::string(f.consumer);
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace idem::redis_internal

namespace idem::redis {
namespace {

using redis_internal::Conn;
using redis_internal::Pool;
using redis_internal::ReplyPtr;
using redis_internal::ReplyString;
using redis_internal::Script;

// Takes over the entries whose lease ran out, then reads new ones
// (XREADGROUP >), and sets the lease of each (XCLAIM TIME, keeping its
// delivery count): all in one script, so no entry is ever handed out without
// a lease. The lease end E of an entry is stored as its delivery time
// E - shift, so XPENDING's idle time is server_now - E + shift. The due
// entries are found with XPENDING IDLE (a pre-filter) and then checked
// exactly against the Env's now: E = t - idle + shift, where t is the
// server's TIME read just before and just after XPENDING (equal, so it is
// the time XPENDING used; when the clock ticked in between, read again).
// XAUTOCLAIM is not used for this: it reads the server's clock once more, so
// a lease could end up to a millisecond early.
// Returns {{entry id, delivery count, fields}...} and, when nothing was
// found, the id of the stream's last entry (for XREAD BLOCK).
// KEYS: stream. ARGV: group, consumer, now, lease_ms, max, shift.
constexpr Script kReceive{"idem_streams_receive", R"lua(
if redis.replicate_commands then redis.replicate_commands() end
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local now, lease, max, shift = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local function fmt(n) return string.format('%.0f', n) end
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local lease_end = fmt(now + lease - shift)
local out = {}
local due = {}
for try = 1, 5 do
  local t = server_ms()
  local min_idle = shift + t - now - 1
  if min_idle < 1 then min_idle = 1 end
  local p = redis.call('XPENDING', stream, group, 'IDLE', fmt(min_idle), '-', '+', max + 16)
  if server_ms() == t then
    for _, e in ipairs(p) do
      if t - e[3] + shift <= now and #due < max then due[#due + 1] = e end
    end
    break
  end
end
for _, e in ipairs(due) do
  local count = e[4] + 1
  local r = redis.call('XCLAIM', stream, group, consumer, 0, e[1], 'TIME', lease_end, 'RETRYCOUNT', count)
  if type(r[1]) == 'table' and type(r[1][2]) == 'table' then
    out[#out + 1] = {r[1][1], count, r[1][2]}
  end
end
if #out < max then
  local r = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', max - #out, 'STREAMS', stream, '>')
  if type(r) == 'table' and r[1] then
    for _, e in ipairs(r[1][2]) do
      redis.call('XCLAIM', stream, group, consumer, 0, e[1], 'TIME', lease_end, 'RETRYCOUNT', 1, 'JUSTID')
      out[#out + 1] = {e[1], 1, e[2]}
    end
  end
end
local last = ''
if #out == 0 then
  local l = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
  if l[1] then last = l[1][1] else last = '0-0' end
end
return {out, last}
)lua"};

// The delivery named by a receipt still holds its lease: the entry is
// pending, for that consumer, with that delivery count. Then XACK (and
// XDEL), or (op "lease": a nack, or ExtendLease) move the lease end: the
// consumer claims its own entry again with the new stored delivery time,
// keeping the delivery count. Check and claim are one script, so no Receive
// of another consumer can take the entry over between them (XPENDING ...
// <consumer> then XCLAIM from the client could renew a lease that another
// consumer took in between, and would take the entry back from it).
// Returns {1} done, {0} not pending (acked already, or deleted),
// {-1, owner, count} taken over since.
// KEYS: stream. ARGV: group, entry id, count, consumer, op ("ack", "ack+del",
// "lease"), stored delivery time for "lease".
constexpr Script kSettle{"idem_streams_settle", R"lua(
local stream, group, id, count, consumer, op = KEYS[1], ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]
local p = redis.call('XPENDING', stream, group, id, id, 1)
if not p[1] then return {0} end
if p[1][2] ~= consumer or p[1][4] ~= count then return {-1, p[1][2], p[1][4]} end
if op == 'lease' then
  redis.call('XCLAIM', stream, group, consumer, 0, id, 'TIME', ARGV[6], 'RETRYCOUNT', count, 'JUSTID')
  return {1}
end
redis.call('XACK', stream, group, id)
if op == 'ack+del' then redis.call('XDEL', stream, id) end
return {1}
)lua"};

// A clean stop: XGROUP DELCONSUMER of `consumer` only when nothing is
// pending under it (DELCONSUMER would drop its entries' pending state, and
// with it every later takeover of them). One script, so a Receive of another
// thread cannot claim an entry under the name between the check and the
// removal. Returns 1 removed, 0 kept (entries pending).
// KEYS: stream. ARGV: group, consumer.
constexpr Script kRemoveConsumer{"idem_streams_remove_consumer", R"lua(
local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if p[1] then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
)lua"};

// The oldest entry the group may still deliver: the smallest id pending
// (XPENDING's summary: delivered, not acknowledged) and the first entry after
// the group's last-delivered-id (not delivered yet). One script, so no entry
// moves from the one to the other between the two reads.
// Returns {smallest pending id or false, first undelivered id or false}.
// KEYS: stream. ARGV: group.
constexpr Script kHorizon{"idem_streams_horizon", R"lua(
local stream, group = KEYS[1], ARGV[1]
local p = redis.call('XPENDING', stream, group)
local pending = false
if p[1] > 0 then pending = p[2] end
local last = nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local name, delivered
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then delivered = g[i + 1] end
  end
  if name == group then last = delivered end
end
if not last then return redis.error_reply('NOGROUP no consumer group ' .. group) end
local next = redis.call('XRANGE', stream, '(' .. last, '+', 'COUNT', 1)
local undelivered = false
if next[1] then undelivered = next[1][1] end
return {pending, undelivered}
)lua"};

bool ParseInt64(std::string_view s, int64_t& out) {
  if (s.empty()) return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

// "<ms>-<seq>"
bool IsEntryId(std::string_view s) {
  auto dash = s.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash + 1 == s.size()) return false;
  for (size_t i = 0; i < s.size(); ++i)
    if (i != dash && (s[i] < '0' || s[i] > '9')) return false;
  return true;
}

struct Receipt {
  std::string entry;
  int64_t count = 0;
  std::string consumer;
};

Result<Receipt> ParseReceipt(const std::string& r) {
  auto c1 = r.find(':');
  auto c2 = c1 == std::string::npos ? std::string::npos : r.find(':', c1 + 1);
  Receipt out;
  if (c2 != std::string::npos) {
    out.entry = r.substr(0, c1);
    out.consumer = r.substr(c2 + 1);
  }
  if (c2 == std::string::npos || !IsEntryId(out.entry) ||
      !ParseInt64(std::string_view(r).substr(c1 + 1, c2 - c1 - 1), out.count) || out.count < 1 || out.consumer.empty())
    return Status::InvalidArgument("not a Redis stream receipt: '" + r + "'");
  return out;
}

std::string NewConsumerName() {
  static std::atomic<uint64_t> counter{0};
  char host[64] = {0};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::snprintf(host, sizeof host, "host");
  for (char* c = host; *c; ++c)
    if (*c <= ' ' || *c > '~') *c = '_';
  std::random_device rd;
  char buf[160];
  std::snprintf(buf, sizeof buf, "idem-%s-%d-%08x%02llx", host, static_cast<int>(::getpid()), rd(),
                static_cast<unsigned long long>(counter.fetch_add(1) & 0xff));
  return buf;
}

class StreamSourceImpl final : public StreamSource {
 public:
  StreamSourceImpl(Options o, redis_internal::Endpoint ep, Pool::Options po)
      : o_(std::move(o)), pool_(std::move(ep), std::move(po)) {}

  Status Init() {
    auto conn = pool_.Take();
    if (!conn.ok()) return conn.status();
    return EnsureGroup(**conn);
  }

  ~StreamSourceImpl() override {
    if (may_be_registered_.load()) (void)Close();
  }

  const std::string& consumer() const override { return o_.consumer; }

  Status Close() override {
    may_be_registered_ = false;
    IDEM_ASSIGN_OR_RETURN(auto conn, pool_.Take());
    const std::string keys[] = {o_.stream};
    const std::string args[] = {o_.group, o_.consumer};
    auto r = conn->Eval(kRemoveConsumer, keys, args);
    // No group (or no stream): no consumer name to remove.
    if (!r.ok() && !IsNoGroup(r.status())) {
      may_be_registered_ = true;
      return r.status().WithContext("remove consumer '" + o_.consumer + "' from " + Where());
    }
    return Status::OK();
  }

  Result<std::string> Publish(const Message& m) override {
    IDEM_ASSIGN_OR_RETURN(auto conn, pool_.Take());
    return redis_internal::StreamAppend(*conn, o_.stream, o_.id_field, o_.payload_field, m);
  }

  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override {
    if (max < 1) return Status::InvalidArgument("Receive: max must be at least 1");
    Env* env = o_.env;
    const int64_t deadline = env->NowMs() + std::max<int64_t>(0, wait_ms);
    const bool block_in_redis = env == Env::Default();
    IDEM_ASSIGN_OR_RETURN(auto conn, pool_.Take());
    may_be_registered_ = true;  // XREADGROUP enters the name in the group
    for (;;) {
      const int64_t now = env->NowMs();
      std::string last;
      IDEM_ASSIGN_OR_RETURN(std::vector<Delivery> got, TryReceive(*conn, max, now, &last));
      if (!got.empty()) return got;
      const int64_t left = deadline - env->NowMs();
      if (left <= 0) return got;
      const int64_t slice = std::min(left, o_.poll_ms);
      if (block_in_redis) {
        // Wakes at the next XADD; takes nothing (the group's entries are
        // read by the script only).
        const std::string ms = std::to_string(slice);
        auto r = conn->Command({"XREAD", "BLOCK", ms, "COUNT", "1", "STREAMS", o_.stream, last});
        if (!r.ok()) return r.status().WithContext("wait for stream " + o_.stream);
      } else {
        env->SleepMs(slice);
      }
    }
  }

  Status Ack(const Delivery& d) override { return Settle(d, "ack", o_.delete_on_ack ? "ack+del" : "ack", 0); }

  Status Nack(const Delivery& d, int64_t delay_ms) override {
    return Settle(d, "nack", "lease", StoredLeaseEnd(delay_ms));
  }

  int64_t lease_ms() const override { return o_.lease_ms; }

  // The time part of the oldest entry id the group may still deliver (see
  // kHorizon): Redis makes an id from its clock at XADD.
  Result<RedeliveryHorizon> Horizon() override {
    IDEM_ASSIGN_OR_RETURN(auto conn, pool_.Take());
    auto r = Run(*conn, kHorizon, {o_.group}, nullptr);
    if (!r.ok()) return r.status().WithContext("redelivery horizon of " + Where());
    const redisReply* rep = r->get();
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2)
      return Status::Internal("redelivery horizon: unexpected reply from " + Where());
    std::optional<int64_t> oldest;
    for (size_t i = 0; i < 2; ++i) {
      const redisReply* e = rep->element[i];
      if (e->type != REDIS_REPLY_STRING) continue;  // false: none of that kind
      const std::string_view id = ReplyString(e);
      int64_t ms = 0;
      if (!IsEntryId(id) || !ParseInt64(id.substr(0, id.find('-')), ms))
        return Status::Internal("redelivery horizon: entry id '" + std::string(id) + "' from " + Where());
      oldest = oldest ? std::min(*oldest, ms) : ms;
    }
    return oldest ? RedeliveryHorizon::At(*oldest) : RedeliveryHorizon::None();
  }

  // The same move of the lease end as a nack whose delay is the lease: the
  // entry stays pending under this consumer, with its delivery count, and
  // is due for takeover lease_ms from now.
  Status ExtendLease(const Delivery& d) override {
    return Settle(d, "lease extension", "lease", StoredLeaseEnd(o_.lease_ms));
  }

 private:
  // The stored delivery time of a lease that ends `from_now_ms` after the
  // Env's now. A delivery time in the future would be clamped by Redis: keep
  // it well in the past (see kLeaseClockShiftMs).
  int64_t StoredLeaseEnd(int64_t from_now_ms) const {
    return o_.env->NowMs() + std::clamp<int64_t>(from_now_ms, 0, kLeaseClockShiftMs / 2) - kLeaseClockShiftMs;
  }

  std::string Where() const {
    return "stream '" + o_.stream + "' group '" + o_.group + "' at " + pool_.endpoint().Address();
  }

  static bool IsNoGroup(const Status& s) { return s.message().find("NOGROUP") != std::string::npos; }

  Status NoGroup() const {
    return Status::NotFound("consumer group '" + o_.group + "' of stream '" + o_.stream + "' does not exist at " +
                            pool_.endpoint().Address() + " (create it, or set create_group)");
  }

  Status EnsureGroup(Conn& conn) {
    if (!o_.create_group) {
      auto r = conn.Command({"XINFO", "GROUPS", o_.stream});
      if (!r.ok()) {
        if (r.status().message().find("no such key") != std::string::npos) return NoGroup();
        return r.status().WithContext(Where());
      }
      const redisReply* rep = r->get();
      for (size_t i = 0; rep->type == REDIS_REPLY_ARRAY && i < rep->elements; ++i) {
        const redisReply* g = rep->element[i];
        for (size_t k = 0; g->type == REDIS_REPLY_ARRAY && k + 1 < g->elements; k += 2)
          if (ReplyString(g->element[k]) == "name" && ReplyString(g->element[k + 1]) == o_.group) return Status::OK();
      }
      return NoGroup();
    }
    auto r = conn.Command({"XGROUP", "CREATE", o_.stream, o_.group, "0", "MKSTREAM"});
    if (!r.ok() && r.status().message().find("BUSYGROUP") == std::string::npos)
      return r.status().WithContext("create consumer group of " + Where());
    return Status::OK();
  }

  // Runs a script; on NOGROUP (a flushed or replaced server) creates the
  // group once (create_group) and runs it again.
  Result<ReplyPtr> Run(Conn& conn, const Script& script, const std::vector<std::string>& args, bool* no_group) {
    const std::string keys[] = {o_.stream};
    for (int attempt = 0;; ++attempt) {
      auto r = conn.Eval(script, keys, args);
      if (r.ok() || !IsNoGroup(r.status())) return r;
      if (attempt > 0 || !o_.create_group) {
        if (no_group) *no_group = true;
        return NoGroup();
      }
      IDEM_RETURN_IF_ERROR(EnsureGroup(conn));
    }
  }

  Result<std::vector<Delivery>> TryReceive(Conn& conn, int max, int64_t now, std::string* last) {
    std::vector<std::string> args{o_.group,
                                  o_.consumer,
                                  std::to_string(now),
                                  std::to_string(o_.lease_ms),
                                  std::to_string(max),
                                  std::to_string(kLeaseClockShiftMs)};
    auto r = Run(conn, kReceive, args, nullptr);
    if (!r.ok()) return r.status().WithContext("receive from " + Where());
    return redis_internal::DecodeReceiveReply(r->get(),
                                              {.stream = o_.stream,
                                               .consumer = o_.consumer,
                                               .id_field = o_.id_field,
                                               .payload_field = o_.payload_field,
                                               .where = Where()},
                                              last);
  }

  // `verb` names the call in errors; `op` and `lease_time` are kSettle's.
  Status Settle(const Delivery& d, std::string_view verb, const char* op, int64_t lease_time) {
    IDEM_ASSIGN_OR_RETURN(Receipt rc, ParseReceipt(d.receipt));
    std::vector<std::string> args{o_.group,    rc.entry, std::to_string(rc.count),
                                  rc.consumer, op,       std::to_string(lease_time)};
    IDEM_ASSIGN_OR_RETURN(auto conn, pool_.Take());
    bool no_group = false;
    auto r = Run(*conn, kSettle, args, &no_group);
    if (!r.ok()) {
      if (no_group) return Status::LeaseLost(std::string(verb) + " of " + d.message.id + ": " + r.status().message());
      return r.status().WithContext(std::string(verb) + " of entry " + rc.entry + " in " + Where());
    }
    const redisReply* rep = r->get();
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 1)
      return Status::Internal(std::string(verb) + ": unexpected reply from " + Where());
    IDEM_ASSIGN_OR_RETURN(int64_t done, redis_internal::ReplyInt(rep->element[0], "settle"));
    if (done == 1) return Status::OK();
    std::string m = std::string(verb) + " of " + d.message.id + " (entry " + rc.entry + ", delivery " +
                    std::to_string(rc.count) + " to " + rc.consumer + "): ";
    if (done == 0) {
      m += "no longer pending in group '" + o_.group + "' (acked already, or deleted)";
    } else {
      m += "its lease expired and it was delivered again";
      if (rep->elements >= 3)
        m += " (delivery " + std::to_string(rep->element[2]->integer) + " to " +
             std::string(ReplyString(rep->element[1])) + ")";
    }
    return Status::LeaseLost(std::move(m));
  }

  Options o_;
  Pool pool_;
  // Whether the name may be in the group without a Close() since: a Receive
  // ran (or Close failed). A stable name may be there from an earlier
  // process, so a handle starts with true.
  std::atomic<bool> may_be_registered_{true};
};

}  // namespace

Result<std::unique_ptr<StreamSource>> StreamSource::Open(const Options& options) {
  Options o = options;
  auto invalid = [](std::string m) { return Status::InvalidArgument("Redis stream source: " + std::move(m)); };
  IDEM_RETURN_IF_ERROR(options_internal::NotEmpty("Redis stream source", "stream", o.stream));
  IDEM_RETURN_IF_ERROR(options_internal::NotEmpty("Redis stream source", "group", o.group));
  IDEM_RETURN_IF_ERROR(redis_internal::CheckStreamField("id_field", o.id_field));
  IDEM_RETURN_IF_ERROR(redis_internal::CheckStreamField("payload_field", o.payload_field));
  if (o.id_field == o.payload_field) return invalid("id_field and payload_field must differ");
  IDEM_RETURN_IF_ERROR(options_internal::AtLeast("Redis stream source", "lease_ms", o.lease_ms, 1));
  if (o.lease_ms > kLeaseClockShiftMs / 2) return invalid("lease_ms is too long");
  constexpr std::string_view kWhat = "Redis stream source";
  IDEM_RETURN_IF_ERROR(options_internal::InRange(kWhat, "connect_timeout_ms", o.connect_timeout_ms, 1, 3'600'000));
  IDEM_RETURN_IF_ERROR(options_internal::AtLeast(kWhat, "poll_ms", o.poll_ms, 1));
  IDEM_RETURN_IF_ERROR(options_internal::AtLeast(kWhat, "pool_size", o.pool_size, 1));
  if (o.env == nullptr) o.env = Env::Default();
  if (o.env->NowMs() < kLeaseClockShiftMs)
    return invalid("the Env's clock must read milliseconds since the Unix epoch (it reads " +
                   std::to_string(o.env->NowMs()) + ")");
  if (o.consumer.empty()) o.consumer = NewConsumerName();
  IDEM_ASSIGN_OR_RETURN(redis_internal::Endpoint ep, redis_internal::ParseUrl(o.url));
  Pool::Options po;
  po.size = o.pool_size;
  po.connect.connect_timeout_ms = static_cast<int>(o.connect_timeout_ms);
  // A waiting Receive blocks in XREAD for up to poll_ms.
  po.connect.command_timeout_ms = static_cast<int>(std::min<int64_t>(5'000 + o.poll_ms, 600'000));
  if (redis_internal::ValidateClientName(o.consumer).ok()) po.connect.client_name = o.consumer;
  auto src = std::make_unique<StreamSourceImpl>(std::move(o), std::move(ep), po);
  IDEM_RETURN_IF_ERROR(src->Init());
  return std::unique_ptr<StreamSource>(std::move(src));
}

Result<StreamSource::Options> StreamSource::ParseUrl(std::string_view url) {
  return redis_internal::ParseStreamUrl(url, /*need_stream=*/true);
}

}  // namespace idem::redis

namespace idem::redis_internal {

Result<redis::StreamSource::Options> ParseStreamUrl(std::string_view url, bool need_stream) {
  using redis::StreamSource;
  using Options = StreamSource::Options;
  IDEM_ASSIGN_OR_RETURN(ParsedUrl u, idem::ParseUrl(url, "Redis stream URL"));
  if (u.scheme != "redis")
    return Status::InvalidArgument("not a Redis stream URL: '" + RedactUrl(url) +
                                   "' (expected redis://HOST[:PORT][/DB]?stream=S)");
  IDEM_RETURN_IF_ERROR(u.CheckKeys({"stream", "group", "consumer", "id_field", "payload_field", "lease_ms",
                                    "create_group", "delete_on_ack", "poll_ms", "pool_size", "connect_timeout_ms"}));
  Options o;
  o.url = std::string(url.substr(0, url.find('?')));
  // The connection part is checked here too, so that a bad host or port is
  // named by ParseUrl.
  IDEM_RETURN_IF_ERROR(redis_internal::ParseUrl(o.url).status());
  o.stream = u.Get("stream");
  if (o.stream.empty() && need_stream)
    return Status::InvalidArgument("a Redis stream URL needs ?stream=NAME: '" + RedactUrl(url) + "'");
  o.group = u.Get("group", "idem");
  o.consumer = u.Get("consumer");
  o.id_field = u.Get("id_field", o.id_field);
  o.payload_field = u.Get("payload_field", o.payload_field);
  IDEM_ASSIGN_OR_RETURN(o.lease_ms, u.GetInt("lease_ms", o.lease_ms, 1, redis::kLeaseClockShiftMs / 2));
  IDEM_ASSIGN_OR_RETURN(o.create_group, u.GetBool("create_group", o.create_group));
  IDEM_ASSIGN_OR_RETURN(o.delete_on_ack, u.GetBool("delete_on_ack", o.delete_on_ack));
  IDEM_ASSIGN_OR_RETURN(o.poll_ms, u.GetInt("poll_ms", o.poll_ms, 1, 600'000));
  IDEM_ASSIGN_OR_RETURN(int64_t pool, u.GetInt("pool_size", o.pool_size, 1, 1'000));
  o.pool_size = static_cast<int>(pool);
  IDEM_ASSIGN_OR_RETURN(o.connect_timeout_ms, u.GetInt("connect_timeout_ms", o.connect_timeout_ms, 1, 3'600'000));
  return o;
}

}  // namespace idem::redis_internal
