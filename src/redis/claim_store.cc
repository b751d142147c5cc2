// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/redis/claim_store.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "redis/client.h"
#include "redis/scripts.h"
#include "redis/url_options.h"

namespace idem::redis {
namespace {

using Options = ClaimStore::Options;

using redis_internal::Conn;
using redis_internal::Pool;
using redis_internal::ReplyInt;
using redis_internal::ReplyPtr;
using redis_internal::ReplyString;

// Spans longer than this (a century) are cut to it, so that now + span stays
// an exact integer in Lua's doubles.
constexpr int64_t kMaxSpanMs = 100LL * 365 * 24 * 3600 * 1000;
// A completed record stays at least this long whatever its retention, so a
// retried Complete of the same token still finds it (and answers OK).
constexpr int64_t kMinCompletedTtlMs = 60'000;

int64_t ClampSpan(int64_t ms) { return std::clamp<int64_t>(ms, 0, kMaxSpanMs); }

std::string_view Element(const redisReply* r, size_t i) {
  return r != nullptr && r->type == REDIS_REPLY_ARRAY && i < r->elements ? ReplyString(r->element[i])
                                                                         : std::string_view();
}

Result<int64_t> IntElement(const redisReply* r, size_t i, std::string_view what) {
  if (r == nullptr || r->type != REDIS_REPLY_ARRAY || i >= r->elements)
    return Status::Internal("unexpected reply to " + std::string(what) + ": too few elements");
  return ReplyInt(r->element[i], what);
}

Result<Fingerprint> ToFingerprint(std::string_view bytes, std::string_view what) {
  Fingerprint fp{};
  if (bytes.size() != fp.size())
    return Status::Corruption(std::string(what) + ": the stored fingerprint is " + std::to_string(bytes.size()) +
                              " bytes, not 32 (a key under idem's prefix that idem did not write?)");
  std::memcpy(fp.data(), bytes.data(), fp.size());
  return fp;
}

Status ValidateName(std::string_view s, std::string_view what) {
  if (s.empty() || s.size() > kMaxIdBytes)
    return Status::InvalidArgument(std::string(what) + " must be 1.." + std::to_string(kMaxIdBytes) + " bytes, got " +
                                   std::to_string(s.size()));
  return Status::OK();
}

// A record as stored (see scripts.h for the layout); views into the value.
struct StoredRecord {
  char state = 0;  // 'p' (in progress), 'c' (completed) or 'r' (released: a tombstone)
  bool is_error = false;
  bool watched = false;
  std::string_view fingerprint;  // 32 bytes
  int64_t fence = 0, lease_until_ms = 0, expires_at_ms = 0, updated_at_ms = 0;
  std::string_view result;
};

constexpr size_t kHeadBytes = 3 + 32;

// Parses a record written by the scripts; nullopt when `v` is not one.
std::optional<StoredRecord> ParseRecord(std::string_view v) {
  if (v.size() < kHeadBytes || (v[0] != 'p' && v[0] != 'c' && v[0] != 'r')) return std::nullopt;
  StoredRecord r;
  r.state = v[0];
  r.is_error = v[1] == '1';
  r.watched = v[2] == '1';
  r.fingerprint = v.substr(3, 32);
  const char* p = v.data() + kHeadBytes;
  const char* end = v.data() + v.size();
  for (int64_t* field : {&r.fence, &r.lease_until_ms, &r.expires_at_ms, &r.updated_at_ms}) {
    auto [q, ec] = std::from_chars(p, end, *field);
    if (ec != std::errc() || q == end || *q != ':') return std::nullopt;
    p = q + 1;
  }
  r.result = std::string_view(p, static_cast<size_t>(end - p));
  return r;
}

// Why a token no longer holds its key, from the script's {'lost', fence, state}.
// A request's scope and key, as Redis key names can hold them.
Status ValidateKey(const ClaimRequest& r) {
  IDEM_RETURN_IF_ERROR(ValidateName(r.scope, "claim scope"));
  return ValidateName(r.key, "idempotency key");
}

Status LeaseLost(const redisReply* r, const ClaimToken& t, std::string_view op) {
  auto fence = IntElement(r, 1, op);
  std::string_view state = Element(r, 2);
  std::string why;
  if (state == "r") {
    why = "no claim on the key (released, expired or purged)";
  } else if (!state.empty() && state != "p" && state != "c") {
    why = "the record is not what idem wrote (state '" + std::string(state) + "')";
  } else if (!fence.ok() || *fence == 0) {
    why = "no claim on the key (released, expired or purged)";
  } else if (*fence != t.fence) {
    why = "the key was taken over by fence " + std::to_string(*fence) + " after the lease expired";
  } else if (state == "c") {
    why = "the claim was completed already";
  } else {
    why = "the record is not what idem wrote (state '" + std::string(state) + "')";
  }
  return Status::LeaseLost(std::string(op) + " of " + t.scope + "/" + t.key + " with fence " + std::to_string(t.fence) +
                           ": " + why);
}

// Woken by the PUBLISH of a Complete or Release script. Subscribed and
// registered on the record (add_waiter) before the caller first reads the
// key, so a later change publishes and is not missed; a claim made after the
// registration does not publish and is seen at the caller's next poll.
class RedisWatch final : public idem::ClaimStore::Watch {
 public:
  explicit RedisWatch(std::unique_ptr<Conn> sub) : sub_(std::move(sub)) {}
  void Wait(int64_t max_wait_ms) override { (void)sub_->AwaitReply(max_wait_ms); }

 private:
  std::unique_ptr<Conn> sub_;  // closed with the watch: UNSUBSCRIBE is implied
};

class RedisClaimStore final : public ClaimStore {
 public:
  RedisClaimStore(const Options& o, redis_internal::Endpoint ep)
      : options_(o),
        pool_(std::move(ep), {.connect = {.connect_timeout_ms = o.connect_timeout_ms,
                                          .command_timeout_ms = o.command_timeout_ms,
                                          .client_name = o.client_name},
                              .size = std::max(1, o.pool_size)}),
        // The claim scripts from every thread share a few pipelined
        // connections (see Pipeline); the pool serves the rest.
        scripts_(pool_.endpoint(),
                 {.connect_timeout_ms = o.connect_timeout_ms,
                  .command_timeout_ms = o.command_timeout_ms,
                  .client_name = o.client_name},
                 {&redis_internal::kTryClaim, &redis_internal::kComplete, &redis_internal::kRelease,
                  &redis_internal::kExtend, &redis_internal::kAddWaiter, &redis_internal::kReserveFences},
                 kPipelinedConnections) {}

  // Connects once and loads every script, so that a wrong URL, password or
  // a server without scripting shows at Open.
  Status Init() {
    IDEM_RETURN_IF_ERROR(scripts_.Connect());
    if (options_.clock != nullptr) return Status::OK();
    std::vector<std::string_view> cmd[1] = {{"TIME"}};
    IDEM_ASSIGN_OR_RETURN(std::vector<ReplyPtr> r, scripts_.Commands(cmd));
    if (r.size() != 1) return Status::Internal("unexpected reply to TIME");
    return ServerNow(r[0].get()).status();
  }

  // A new key is claimed with one plain SET ... NX GET (no script: a script
  // costs the server several times more); the same command reads the
  // record when the key exists, and a replay, a conflict or a key in
  // progress is answered from it. Only a key to take over (or released, or
  // expired) runs the script, which judges it again atomically. Many
  // requests travel together: their SETs in one pipeline, then the scripts
  // of those that need one in another.
  Result<ClaimOutcome> TryClaim(const ClaimRequest& req) override {
    return std::move(TryClaimMany(std::span<const ClaimRequest>(&req, 1)).front());
  }

  std::vector<Result<ClaimOutcome>> TryClaimMany(std::span<const ClaimRequest> reqs) override {
    std::vector<std::optional<Result<ClaimOutcome>>> out(reqs.size());
    std::vector<size_t> valid;
    for (size_t i = 0; i < reqs.size(); ++i) {
      Status s = ValidateKey(reqs[i]);
      if (s.ok() && reqs[i].lease_ms <= 0)
        s = Status::InvalidArgument("lease_ms must be > 0, got " + std::to_string(reqs[i].lease_ms));
      if (s.ok()) {
        valid.push_back(i);
      } else {
        out[i].emplace(std::move(s));
      }
    }
    if (!valid.empty() && set_get_.load(std::memory_order_relaxed)) {
      auto fresh = ClaimIfAbsent(reqs, valid);
      if (fresh.ok()) {
        for (size_t k = 0; k < valid.size(); ++k)
          if ((*fresh)[k].has_value()) out[valid[k]].emplace(std::move(*(*fresh)[k]));
      } else if (fresh.status().code() == Code::kInvalidArgument) {
        set_get_.store(false, std::memory_order_relaxed);  // a server before 7.0: scripts from now on
      } else {
        for (size_t i : valid) out[i].emplace(fresh.status());
      }
    }
    // The rest: the script decides.
    std::vector<size_t> scripted;
    for (size_t i : valid)
      if (!out[i].has_value()) scripted.push_back(i);
    if (!scripted.empty()) {
      const std::string fence_key = options_.prefix + "fence";
      std::vector<std::array<std::string, 2>> keys;
      std::vector<std::array<std::string, 4>> args;
      std::vector<redis_internal::Pipeline::EvalCall> calls;
      keys.reserve(scripted.size());
      args.reserve(scripted.size());
      for (size_t i : scripted) {
        const ClaimRequest& req = reqs[i];
        keys.push_back({RecordKey(req.scope, req.key), fence_key});
        args.push_back({NowArg(), FingerprintBytes(req.fingerprint), std::to_string(ClampSpan(req.lease_ms)),
                        std::to_string(ClampSpan(options_.abandon_margin_ms))});
        calls.push_back({keys.back(), args.back()});
      }
      auto replies = RunMany(redis_internal::kTryClaim, calls);
      for (size_t k = 0; k < scripted.size(); ++k) {
        const size_t i = scripted[k];
        if (!replies[k].ok()) {
          out[i].emplace(replies[k].status());
        } else {
          out[i].emplace(ToOutcome(replies[k]->get(), reqs[i]));
        }
      }
    }
    std::vector<Result<ClaimOutcome>> answers;
    answers.reserve(reqs.size());
    for (auto& o : out) answers.push_back(std::move(*o));
    return answers;
  }

  Result<std::optional<ClaimOutcome>> Peek(const ClaimRequest& req) override {
    IDEM_RETURN_IF_ERROR(ValidateKey(req));
    return Judge(RecordKey(req.scope, req.key), req);
  }

  Status Complete(const ClaimToken& t, std::string_view result, bool is_error, int64_t retention_ms) override {
    const Completion c{.token = &t, .result = result, .is_error = is_error};
    return std::move(CompleteMany(std::span<const Completion>(&c, 1), retention_ms).front());
  }

  // One script per chunk of completions, every chunk in one pipeline.
  std::vector<Status> CompleteMany(std::span<const Completion> done, int64_t retention_ms) override {
    if (retention_ms < 0)
      return std::vector<Status>(
          done.size(), Status::InvalidArgument("retention_ms must be >= 0, got " + std::to_string(retention_ms)));
    // The completion's time only dates the record and its expiry (no lease
    // is judged by it): the instance's estimate of the server's clock spares
    // the script a TIME.
    const std::string now = std::to_string(EstimatedNowMs());
    const size_t chunks = (done.size() + kCompleteChunk - 1) / kCompleteChunk;
    std::vector<std::vector<std::string>> keys(chunks), args(chunks);
    std::vector<redis_internal::Pipeline::EvalCall> calls;
    for (size_t c = 0; c < chunks; ++c) {
      args[c] = {now, std::to_string(ClampSpan(retention_ms)), std::to_string(kMinCompletedTtlMs)};
      for (size_t k = c * kCompleteChunk; k < std::min(done.size(), (c + 1) * kCompleteChunk); ++k) {
        const ClaimToken& t = *done[k].token;
        keys[c].push_back(RecordKey(t.scope, t.key));
        args[c].insert(args[c].end(), {std::to_string(t.fence), std::string(done[k].result),
                                       done[k].is_error ? "1" : "0", Channel(t.scope, t.key)});
      }
      calls.push_back({keys[c], args[c]});
    }
    auto replies = RunMany(redis_internal::kComplete, calls);
    std::vector<Status> out;
    out.reserve(done.size());
    for (size_t k = 0; k < done.size(); ++k) {
      const ClaimToken& t = *done[k].token;
      const auto& chunk = replies[k / kCompleteChunk];
      const size_t i = k % kCompleteChunk;
      if (!chunk.ok()) {
        out.push_back(chunk.status());
      } else if (i >= (*chunk)->elements) {
        out.push_back(Status::Internal("unexpected reply from script complete: too few elements"));
      } else if (const redisReply* r = (*chunk)->element[i]; Element(r, 0) != "ok") {
        out.push_back(LeaseLost(r, t, "Complete"));
      } else {
        NotifyChanged(t.scope, t.key);
        out.push_back(Status::OK());
      }
    }
    return out;
  }

  Status Release(const ClaimToken& t) override {
    const std::string keys[] = {RecordKey(t.scope, t.key)};
    const std::string args[] = {"", std::to_string(t.fence), Channel(t.scope, t.key),
                                std::to_string(redis_internal::kReleasedTtlMs)};
    IDEM_ASSIGN_OR_RETURN(ReplyPtr r, Run(redis_internal::kRelease, keys, args));
    if (Element(r.get(), 0) != "ok") return LeaseLost(r.get(), t, "Release");
    NotifyChanged(t.scope, t.key);
    return Status::OK();
  }

  Result<int64_t> Extend(const ClaimToken& t, int64_t lease_ms) override {
    if (lease_ms <= 0) return Status::InvalidArgument("lease_ms must be > 0, got " + std::to_string(lease_ms));
    const std::string keys[] = {RecordKey(t.scope, t.key)};
    const std::string args[] = {NowArg(), std::to_string(t.fence), std::to_string(ClampSpan(lease_ms)),
                                std::to_string(ClampSpan(options_.abandon_margin_ms))};
    IDEM_ASSIGN_OR_RETURN(ReplyPtr r, Run(redis_internal::kExtend, keys, args));
    if (Element(r.get(), 0) != "ok") return LeaseLost(r.get(), t, "Extend");
    return IntElement(r.get(), 1, "Extend");
  }

  Result<std::optional<ClaimRecord>> FindClaim(std::string_view scope, std::string_view key) override {
    IDEM_ASSIGN_OR_RETURN(Pool::Lease c, pool_.Take());
    const std::string k = RecordKey(scope, key);
    IDEM_ASSIGN_OR_RETURN(ReplyPtr r, c->Command({"GET", k}));
    return ToRecord(r.get(), std::string(scope), std::string(key));
  }

  Result<std::vector<ClaimRecord>> ListClaims(std::string_view scope, int limit) override {
    std::vector<ClaimRecord> out;
    if (limit < 0) return Status::InvalidArgument("a list limit cannot be negative, got " + std::to_string(limit));
    if (limit == 0) return out;
    IDEM_ASSIGN_OR_RETURN(Pool::Lease c, pool_.Take());
    std::unordered_set<std::string> seen;  // SCAN may return a key twice
    IDEM_RETURN_IF_ERROR(Scan(*c, scope, 500, [&](std::span<const std::string> keys) -> Status {
      // One round trip per page: every GET queued, then read.
      for (const std::string& k : keys) IDEM_RETURN_IF_ERROR(c->Append(std::vector<std::string_view>{"GET", k}));
      for (const std::string& k : keys) {
        IDEM_ASSIGN_OR_RETURN(ReplyPtr r, c->Read("GET"));
        std::string s, kk;
        if (!seen.insert(k).second || !SplitRecordKey(k, s, kk)) continue;
        IDEM_ASSIGN_OR_RETURN(std::optional<ClaimRecord> rec, ToRecord(r.get(), std::move(s), std::move(kk)));
        if (rec.has_value()) out.push_back(std::move(*rec));  // else deleted since SCAN saw it
      }
      return Status::OK();
    }));
    std::sort(out.begin(), out.end(),
              [](const ClaimRecord& a, const ClaimRecord& b) { return a.updated_at_ms > b.updated_at_ms; });
    if (limit > 0 && out.size() > static_cast<size_t>(limit)) out.resize(static_cast<size_t>(limit));
    return out;
  }

  Result<int64_t> PurgeClaims(std::string_view scope, int64_t abandoned_after_ms, int batch_size) override {
    if (batch_size < 1) return Status::InvalidArgument("purge batch size must be at least 1");
    if (abandoned_after_ms < 0)
      return Status::InvalidArgument("abandoned_after_ms must be >= 0, got " + std::to_string(abandoned_after_ms));
    IDEM_ASSIGN_OR_RETURN(Pool::Lease c, pool_.Take());
    int64_t purged = 0;
    const std::string after = std::to_string(ClampSpan(abandoned_after_ms));
    // Each SCAN page (about batch_size keys) is judged and deleted by one
    // script; expired records mostly vanish by their TTL before this runs.
    IDEM_RETURN_IF_ERROR(Scan(*c, scope, batch_size, [&](std::span<const std::string> keys) -> Status {
      for (size_t i = 0; i < keys.size(); i += static_cast<size_t>(batch_size)) {
        auto part = keys.subspan(i, std::min(keys.size() - i, static_cast<size_t>(batch_size)));
        const std::string args[] = {NowArg(), after};
        IDEM_ASSIGN_OR_RETURN(ReplyPtr r, c->Eval(redis_internal::kPurge, part, args));
        IDEM_ASSIGN_OR_RETURN(int64_t n, ReplyInt(r.get(), "purge"));
        purged += n;
      }
      return Status::OK();
    }));
    return purged;
  }

  Result<int64_t> NowMs() override {
    if (options_.clock != nullptr) return options_.clock->NowMs();
    IDEM_ASSIGN_OR_RETURN(Pool::Lease c, pool_.Take());
    IDEM_ASSIGN_OR_RETURN(ReplyPtr r, c->Command({"TIME"}));
    IDEM_ASSIGN_OR_RETURN(int64_t s, IntElement(r.get(), 0, "TIME"));
    IDEM_ASSIGN_OR_RETURN(int64_t us, IntElement(r.get(), 1, "TIME"));
    return s * 1000 + us / 1000;
  }

  // A subscriber on the key's channel, so a Complete or Release from any
  // process wakes the waiter. Any failure falls back to the in-process watch
  // (the caller's polls still find the result).
  std::unique_ptr<Watch> WatchKey(std::string_view scope, std::string_view key) override {
    auto sub = pool_.Open();  // a subscribed connection can serve nothing else: not pooled
    if (!sub.ok() || !(*sub)->Command({"SUBSCRIBE", Channel(scope, key)}).ok())
      return idem::ClaimStore::WatchKey(scope, key);
    // Subscribed first, then marked: a Complete or Release that sees the
    // mark publishes to a subscriber that is already listening.
    const std::string keys[] = {RecordKey(scope, key)};
    if (!scripts_.Eval(redis_internal::kAddWaiter, keys, {}).ok()) return idem::ClaimStore::WatchKey(scope, key);
    return std::make_unique<RedisWatch>(std::move(*sub));
  }

 private:
  Result<ReplyPtr> Run(const redis_internal::Script& s, std::span<const std::string> keys,
                       std::span<const std::string> args) {
    const redis_internal::Pipeline::EvalCall call{keys, args};
    return std::move(RunMany(s, std::span(&call, 1)).front());
  }
  // Each reply checked to be the array every script answers.
  std::vector<Result<ReplyPtr>> RunMany(const redis_internal::Script& s,
                                        std::span<const redis_internal::Pipeline::EvalCall> calls) {
    std::vector<Result<ReplyPtr>> replies = scripts_.EvalMany(s, calls);
    for (auto& r : replies)
      if (r.ok() && ((*r)->type != REDIS_REPLY_ARRAY || (*r)->elements == 0))
        r = Status::Internal(std::string("unexpected reply from script ") + s.name);
    return replies;
  }

  Result<ClaimOutcome> ToOutcome(const redisReply* r, const ClaimRequest& req) {
    std::string_view kind = Element(r, 0);
    ClaimOutcome out;
    const std::string what = "claim " + req.scope + "/" + req.key;
    if (kind == "started") {
      out.kind = ClaimOutcome::Kind::kStarted;
      out.token.scope = req.scope;
      out.token.key = req.key;
      IDEM_ASSIGN_OR_RETURN(out.token.fence, IntElement(r, 1, what));
      IDEM_ASSIGN_OR_RETURN(out.token.lease_until_ms, IntElement(r, 2, what));
      IDEM_ASSIGN_OR_RETURN(int64_t took_over, IntElement(r, 3, what));
      out.took_over = took_over != 0;
    } else if (kind == "in_progress") {
      out.kind = ClaimOutcome::Kind::kInProgress;
      IDEM_ASSIGN_OR_RETURN(out.retry_at_ms, IntElement(r, 1, what));
    } else if (kind == "completed") {
      out.kind = ClaimOutcome::Kind::kCompleted;
      out.result = std::string(Element(r, 1));
      IDEM_ASSIGN_OR_RETURN(int64_t is_error, IntElement(r, 2, what));
      out.result_is_error = is_error != 0;
    } else if (kind == "conflict") {
      out.kind = ClaimOutcome::Kind::kConflict;
      IDEM_ASSIGN_OR_RETURN(out.stored_fingerprint, ToFingerprint(Element(r, 1), what));
    } else {
      return Status::Corruption(what + ": the record's state is '" + std::string(Element(r, 1)) +
                                "', not one idem writes");
    }
    return out;
  }

  // The server's time as this process last learned it (TIME replies),
  // carried forward on the steady clock; the caller's clock when given.
  int64_t EstimatedNowMs() const {
    if (options_.clock != nullptr) return options_.clock->NowMs();
    return SteadyMs() + server_offset_ms_.load(std::memory_order_relaxed);
  }
  static int64_t SteadyMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  Result<int64_t> ServerNow(const redisReply* time_reply) {
    IDEM_ASSIGN_OR_RETURN(int64_t s, IntElement(time_reply, 0, "TIME"));
    IDEM_ASSIGN_OR_RETURN(int64_t us, IntElement(time_reply, 1, "TIME"));
    const int64_t now = s * 1000 + us / 1000;
    server_offset_ms_.store(now - SteadyMs(), std::memory_order_relaxed);
    return now;
  }

  // A fencing token for a claim of an absent key, without a claim script:
  // tokens come from a block of kFenceBlock reserved (kReserveFences) on the
  // same counter the claim script draws from. A block serves for at most kFenceBlockMaxAgeMs and
  // less than the lease asked for. A key absent now was never claimed, or
  // its last holder released it (a tombstone outlives a block), or its
  // record expired or was purged, which happens no sooner than one lease
  // after that holder's claim: either way before this block was reserved,
  // so the token is above every earlier holder's of the key. A takeover
  // (the script) draws past every reserved block.
  Result<int64_t> NextFence(int64_t lease_ms) {
    std::lock_guard lock(fence_mu_);
    const int64_t now = SteadyMs();
    if (fence_next_ > fence_end_ || now - fence_reserved_ms_ >= std::min(kFenceBlockMaxAgeMs, lease_ms)) {
      const std::string keys[] = {fence_key_};
      const std::string args[] = {kFenceBlockText};
      IDEM_ASSIGN_OR_RETURN(ReplyPtr r, scripts_.Eval(redis_internal::kReserveFences, keys, args));
      IDEM_ASSIGN_OR_RETURN(int64_t end, ReplyInt(r.get(), "reserve_fences"));
      fence_end_ = end;
      fence_next_ = end - kFenceBlock + 1;
      fence_reserved_ms_ = now;
    }
    return fence_next_++;
  }

  // Claims each of reqs[which] whose key is absent (SET ... NX GET, all in
  // one pipeline, TIME last), answering started; a present record is judged
  // as Judge does. nullopt: the script must decide (take over, released or
  // expired record).
  Result<std::vector<std::optional<Result<ClaimOutcome>>>> ClaimIfAbsent(std::span<const ClaimRequest> reqs,
                                                                         std::span<const size_t> which) {
    const bool own_clock = options_.clock != nullptr;
    std::vector<std::string> record_keys, values, pxs;
    std::vector<int64_t> fences, lease_ends;
    record_keys.reserve(which.size());
    values.reserve(which.size());
    pxs.reserve(which.size());
    const int64_t now = EstimatedNowMs();
    for (size_t i : which) {
      const ClaimRequest& req = reqs[i];
      const int64_t span = ClampSpan(req.lease_ms);
      IDEM_ASSIGN_OR_RETURN(int64_t fence, NextFence(span));
      fences.push_back(fence);
      lease_ends.push_back(now + span);
      record_keys.push_back(RecordKey(req.scope, req.key));
      values.push_back("p00" + FingerprintBytes(req.fingerprint) + std::to_string(fence) + ":" +
                       std::to_string(now + span) + ":0:" + std::to_string(now) + ":");
      pxs.push_back(std::to_string(std::max<int64_t>(1, span + ClampSpan(options_.abandon_margin_ms))));
    }
    std::vector<std::vector<std::string_view>> cmds;
    cmds.reserve(which.size() + 1);
    for (size_t k = 0; k < which.size(); ++k)
      cmds.push_back({"SET", record_keys[k], values[k], "NX", "PX", pxs[k], "GET"});
    if (!own_clock) cmds.push_back({"TIME"});
    auto replies = scripts_.Commands(cmds);
    if (!replies.ok()) {
      // A server before 7.0 answers SET ... NX GET with a syntax error.
      if (replies.status().message().find("syntax error") != std::string::npos)
        return Status::InvalidArgument("SET NX GET unsupported");
      return replies.status();
    }
    if (replies->size() != cmds.size()) return Status::Internal("unexpected replies to SET ... NX GET");
    int64_t server_now = now;
    if (!own_clock) {
      IDEM_ASSIGN_OR_RETURN(server_now, ServerNow(replies->back().get()));
    }
    std::vector<std::optional<Result<ClaimOutcome>>> out(which.size());
    for (size_t k = 0; k < which.size(); ++k) {
      const ClaimRequest& req = reqs[which[k]];
      const redisReply* got = (*replies)[k].get();
      if (got->type == REDIS_REPLY_NIL) {  // it was absent: ours now
        ClaimOutcome o;
        o.kind = ClaimOutcome::Kind::kStarted;
        o.token.scope = req.scope;
        o.token.key = req.key;
        o.token.fence = fences[k];
        o.token.lease_until_ms = lease_ends[k];
        out[k].emplace(std::move(o));
        continue;
      }
      auto judged = JudgeRecord(got, server_now, req);
      if (!judged.ok()) {
        out[k].emplace(judged.status());
      } else if (judged->has_value()) {
        out[k].emplace(std::move(**judged));
      }
    }
    return out;
  }

  // What TryClaim answers for the record at `record_key`, judged as its
  // script would from a GET and the server's TIME (queued together, TIME
  // after GET, so `now` is no earlier than the read); nullopt when the key is
  // to be started or taken over (the script decides that).
  Result<std::optional<ClaimOutcome>> Judge(const std::string& record_key, const ClaimRequest& req) {
    std::vector<std::string_view> cmds[2] = {{"GET", record_key}, {"TIME"}};
    const bool own_clock = options_.clock != nullptr;
    IDEM_ASSIGN_OR_RETURN(std::vector<ReplyPtr> replies,
                          scripts_.Commands(std::span<const std::vector<std::string_view>>(cmds, own_clock ? 1 : 2)));
    const std::string what = "claim " + req.scope + "/" + req.key;
    if (replies.size() != (own_clock ? 1u : 2u)) return Status::Internal("unexpected replies reading " + what);
    int64_t now = 0;
    if (own_clock) {
      now = options_.clock->NowMs();
    } else {
      IDEM_ASSIGN_OR_RETURN(now, ServerNow(replies[1].get()));
    }
    return JudgeRecord(replies[0].get(), now, req);
  }

  // A record read (GET, or SET ... GET) judged at `now`, as the claim
  // script would judge it; nullopt when absent, released, expired or to be
  // taken over.
  Result<std::optional<ClaimOutcome>> JudgeRecord(const redisReply* got, int64_t now, const ClaimRequest& req) {
    const std::string what = "claim " + req.scope + "/" + req.key;
    if (got->type == REDIS_REPLY_NIL) return std::optional<ClaimOutcome>();
    if (got->type != REDIS_REPLY_STRING) return Status::Internal("unexpected reply reading " + what);
    std::optional<StoredRecord> rec = ParseRecord(ReplyString(got));
    if (!rec.has_value()) {
      return Status::Corruption(what + ": the record's state is '" + std::string(ReplyString(got).substr(0, 1)) +
                                "', not one idem writes");
    }
    if (rec->state == 'r') return std::optional<ClaimOutcome>();                               // released
    if (rec->state == 'c' && rec->expires_at_ms <= now) return std::optional<ClaimOutcome>();  // as absent
    ClaimOutcome out;
    if (rec->fingerprint != FingerprintBytes(req.fingerprint)) {
      out.kind = ClaimOutcome::Kind::kConflict;
      IDEM_ASSIGN_OR_RETURN(out.stored_fingerprint, ToFingerprint(rec->fingerprint, what));
    } else if (rec->state == 'c') {
      out.kind = ClaimOutcome::Kind::kCompleted;
      out.result = std::string(rec->result);
      out.result_is_error = rec->is_error;
    } else if (rec->lease_until_ms > now) {
      out.kind = ClaimOutcome::Kind::kInProgress;
      out.retry_at_ms = rec->lease_until_ms;
    } else {
      return std::optional<ClaimOutcome>();  // to take over
    }
    return std::optional<ClaimOutcome>(std::move(out));
  }

  // A GET of a record; nullopt when the key is absent.
  static Result<std::optional<ClaimRecord>> ToRecord(const redisReply* r, std::string scope, std::string key) {
    const std::string what = "claim record " + scope + "/" + key;
    if (r == nullptr) return Status::Internal("unexpected reply reading " + what);
    if (r->type == REDIS_REPLY_NIL) return std::optional<ClaimRecord>();
    if (r->type != REDIS_REPLY_STRING) return Status::Internal("unexpected reply reading " + what);
    std::optional<StoredRecord> stored = ParseRecord(ReplyString(r));
    if (!stored.has_value())
      return Status::Corruption(what + ": '" + std::string(ReplyString(r).substr(0, 8)) + "...' is not idem's record");
    if (stored->state == 'r') return std::optional<ClaimRecord>();  // a released claim's tombstone
    ClaimRecord rec;
    rec.state = stored->state == 'c' ? ClaimRecord::State::kCompleted : ClaimRecord::State::kInProgress;
    IDEM_ASSIGN_OR_RETURN(rec.fingerprint, ToFingerprint(stored->fingerprint, what));
    rec.fence = stored->fence;
    rec.lease_until_ms = stored->lease_until_ms;
    rec.expires_at_ms = stored->expires_at_ms;
    rec.result = std::string(stored->result);
    rec.result_is_error = stored->is_error;
    rec.updated_at_ms = stored->updated_at_ms;
    rec.scope = std::move(scope);
    rec.key = std::move(key);
    return std::optional<ClaimRecord>(std::move(rec));
  }

  // Calls `page` with the record keys of `scope` ("" for all), a SCAN page
  // at a time. Keys may be seen twice or vanish meanwhile (SCAN's promise);
  // both are harmless to the callers.
  template <typename Page>
  Status Scan(Conn& c, std::string_view scope, int count, Page page) {
    std::string match = redis_internal::GlobEscape(options_.prefix + "claim:");
    match += scope.empty() ? "*" : redis_internal::GlobEscape(redis_internal::LengthPrefixed(scope)) + ":*";
    const std::string n = std::to_string(std::max(1, count));
    std::string cursor = "0";
    do {
      IDEM_ASSIGN_OR_RETURN(ReplyPtr r, c.Command({"SCAN", cursor, "MATCH", match, "COUNT", n}));
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 || r->element[1]->type != REDIS_REPLY_ARRAY)
        return Status::Internal("unexpected reply to SCAN");
      cursor = std::string(ReplyString(r->element[0]));
      std::vector<std::string> keys;
      for (size_t i = 0; i < r->element[1]->elements; ++i) keys.emplace_back(ReplyString(r->element[1]->element[i]));
      if (!keys.empty()) IDEM_RETURN_IF_ERROR(page(std::span<const std::string>(keys)));
    } while (cursor != "0" && !cursor.empty());
    return Status::OK();
  }

  std::string RecordKey(std::string_view scope, std::string_view key) const {
    return options_.prefix + "claim:" + redis_internal::LengthPrefixed(scope) + ":" + std::string(key);
  }
  // The inverse of RecordKey, for keys found by SCAN.
  bool SplitRecordKey(std::string_view k, std::string& scope, std::string& key) const {
    const std::string head = options_.prefix + "claim:";
    if (!k.starts_with(head)) return false;
    k.remove_prefix(head.size());
    size_t n = 0, i = 0;
    for (; i < k.size() && k[i] >= '0' && k[i] <= '9'; ++i) n = n * 10 + static_cast<size_t>(k[i] - '0');
    if (i == 0 || i >= k.size() || k[i] != ':' || k.size() < i + 1 + n + 1 || k[i + 1 + n] != ':') return false;
    scope = std::string(k.substr(i + 1, n));
    key = std::string(k.substr(i + 2 + n));
    return true;
  }
  std::string Channel(std::string_view scope, std::string_view key) const {
    return options_.prefix + "changed:" + redis_internal::LengthPrefixed(scope) + ":" + std::string(key);
  }
  // The caller's clock when one was given, else "" (the script reads TIME).
  std::string NowArg() const { return options_.clock ? std::to_string(options_.clock->NowMs()) : std::string(); }
  static std::string FingerprintBytes(const Fingerprint& fp) {
    return std::string(reinterpret_cast<const char*>(fp.data()), fp.size());
  }

  static constexpr int kPipelinedConnections = 2;
  // Completions per script call (the server runs nothing else meanwhile).
  static constexpr size_t kCompleteChunk = 64;
  static constexpr int64_t kFenceBlock = 1000;
  static constexpr const char* kFenceBlockText = "1000";
  // Below the release tombstone's life (redis_internal::kReleasedTtlMs).
  static constexpr int64_t kFenceBlockMaxAgeMs = 1000;
  static_assert(kFenceBlockMaxAgeMs < redis_internal::kReleasedTtlMs);

  // false once the server refused SET ... NX GET (before Redis 7.0).
  std::atomic<bool> set_get_{true};
  // The server's clock minus this process's steady clock, from TIME.
  std::atomic<int64_t> server_offset_ms_{0};
  std::mutex fence_mu_;
  int64_t fence_next_ = 1, fence_end_ = 0, fence_reserved_ms_ = 0;  // under fence_mu_

  const Options options_;
  const std::string fence_key_ = options_.prefix + "fence";
  Pool pool_;
  redis_internal::Pipeline scripts_;
};

}  // namespace

Result<std::unique_ptr<ClaimStore>> ClaimStore::Open(const Options& options) {
  IDEM_ASSIGN_OR_RETURN(redis_internal::Endpoint ep, redis_internal::ParseUrl(options.url));
  IDEM_RETURN_IF_ERROR(redis_internal::CheckConnectFields("Redis claim store", options.pool_size,
                                                          options.connect_timeout_ms, options.command_timeout_ms,
                                                          options.client_name));
  if (options.abandon_margin_ms < 0)
    return Status::InvalidArgument("abandon_margin_ms must be >= 0, got " + std::to_string(options.abandon_margin_ms));
  auto store = std::make_unique<RedisClaimStore>(options, std::move(ep));
  IDEM_RETURN_IF_ERROR(store->Init());
  return std::unique_ptr<ClaimStore>(std::move(store));
}

Result<Options> ClaimStore::ParseUrl(std::string_view url) {
  using redis_internal::GetIntInto;
  using redis_internal::kMaxIntField;
  IDEM_ASSIGN_OR_RETURN(
      redis_internal::UrlWithOptions u,
      redis_internal::ParseUrlWithOptions(url, {"prefix", "pool_size", "connect_timeout_ms", "command_timeout_ms",
                                                "client_name", "abandon_margin_ms"}));
  Options o;
  o.url = u.base;
  o.prefix = u.parsed.Get("prefix", o.prefix);
  o.client_name = u.parsed.Get("client_name", o.client_name);
  IDEM_RETURN_IF_ERROR(GetIntInto(u.parsed, "pool_size", 1, 9999, o.pool_size));
  IDEM_RETURN_IF_ERROR(GetIntInto(u.parsed, "connect_timeout_ms", 1, kMaxIntField, o.connect_timeout_ms));
  IDEM_RETURN_IF_ERROR(GetIntInto(u.parsed, "command_timeout_ms", 1, kMaxIntField, o.command_timeout_ms));
  IDEM_ASSIGN_OR_RETURN(o.abandon_margin_ms,
                        u.parsed.GetInt("abandon_margin_ms", o.abandon_margin_ms, 0, int64_t{1} << 50));
  return o;
}

}  // namespace idem::redis
