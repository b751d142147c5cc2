// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/claims.h"

#include "core/handler_scope.h"
#include "core/kill_point.h"
#include "idem/call_first.h"

#include "core/saturating.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>

namespace idem {

std::string_view KindName(ClaimOutcome::Kind kind) {
  switch (kind) {
    case ClaimOutcome::Kind::kStarted: return "started";
    case ClaimOutcome::Kind::kInProgress: return "in_progress";
    case ClaimOutcome::Kind::kCompleted: return "completed";
    case ClaimOutcome::Kind::kConflict: return "conflict";
  }
  return "unknown";
}

std::string_view StateName(ClaimRecord::State state) {
  return state == ClaimRecord::State::kCompleted ? "completed" : "in_progress";
}

namespace {

// Wakes waiters in this process when a claim they wait for changes. One
// generation counter per hash bucket of (scope, key): a waiter sleeps until
// its bucket's generation moves (or its time is up).
class ChangeBoard {
 public:
  static ChangeBoard& Get() {
    static ChangeBoard* board = new ChangeBoard();  // never destroyed: used from any thread at exit
    return *board;
  }
  uint64_t Generation(size_t bucket) {
    std::lock_guard lock(mu_);
    return gen_[bucket];
  }
  void Bump(size_t bucket) {
    {
      std::lock_guard lock(mu_);
      ++gen_[bucket];
    }
    cv_.notify_all();
  }
  // Returns the generation seen on waking.
  uint64_t WaitPast(size_t bucket, uint64_t seen, int64_t max_wait_ms) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(max_wait_ms), [&] { return gen_[bucket] != seen; });
    return gen_[bucket];
  }
  static size_t Bucket(std::string_view scope, std::string_view key) {
    return (std::hash<std::string_view>{}(scope)*31 + std::hash<std::string_view>{}(key)) % kBuckets;
  }

 private:
  static constexpr size_t kBuckets = 64;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t gen_[kBuckets] = {};
};

Status ValidateRequest(const ClaimRequest& r) {
  if (Status s = ValidateId(r.scope); !s.ok()) return s.WithContext("claim scope");
  if (Status s = ValidateId(r.key); !s.ok()) return s.WithContext("idempotency key");
  if (r.lease_ms <= 0) return Status::InvalidArgument("lease_ms must be > 0, got " + std::to_string(r.lease_ms));
  if (r.wait_ms < 0) return Status::InvalidArgument("wait_ms must be >= 0, got " + std::to_string(r.wait_ms));
  return Status::OK();
}

}  // namespace

namespace {
class BoardWatch final : public ClaimStore::Watch {
 public:
  explicit BoardWatch(size_t bucket) : bucket_(bucket), seen_(ChangeBoard::Get().Generation(bucket)) {}
  void Wait(int64_t max_wait_ms) override { seen_ = ChangeBoard::Get().WaitPast(bucket_, seen_, max_wait_ms); }

 private:
  size_t bucket_;
  uint64_t seen_;
};
}  // namespace

std::unique_ptr<ClaimStore::Watch> ClaimStore::WatchKey(std::string_view scope, std::string_view key) {
  return std::make_unique<BoardWatch>(ChangeBoard::Bucket(scope, key));
}

Result<std::optional<ClaimOutcome>> ClaimStore::Peek(const ClaimRequest&) { return std::optional<ClaimOutcome>(); }

std::vector<Result<ClaimOutcome>> ClaimStore::TryClaimMany(std::span<const ClaimRequest> requests) {
  std::vector<Result<ClaimOutcome>> out;
  out.reserve(requests.size());
  for (const ClaimRequest& r : requests) out.push_back(TryClaim(r));
  return out;
}

std::vector<Status> ClaimStore::CompleteMany(std::span<const Completion> completions, int64_t retention_ms) {
  std::vector<Status> out;
  out.reserve(completions.size());
  for (const Completion& c : completions) out.push_back(Complete(*c.token, c.result, c.is_error, retention_ms));
  return out;
}

Result<int64_t> ClaimStore::CountClaims(std::string_view scope) {
  IDEM_ASSIGN_OR_RETURN(auto all, ListClaims(scope, std::numeric_limits<int>::max()));
  return static_cast<int64_t>(all.size());
}

void ClaimStore::NotifyChanged(std::string_view scope, std::string_view key) {
  ChangeBoard::Get().Bump(ChangeBoard::Bucket(scope, key));
}

Claims::Claims(ClaimStore& store) : Claims(store, Options{}) {}

Claims::Claims(ClaimStore& store, const Options& options) : store_(store), options_(options) {
  if (options_.env == nullptr) options_.env = Env::Default();
}

Result<std::unique_ptr<Claims>> Claims::Open(ClaimStore& store) { return Open(store, Options{}); }

Result<std::unique_ptr<Claims>> Claims::Open(ClaimStore& store, const Options& options) {
  // A result kept for no time would let the work run again at once.
  if (options.retention_ms <= 0)
    return Status::InvalidArgument("Claims::Options::retention_ms must be > 0 (how long a result is kept), got " +
                                   std::to_string(options.retention_ms));
  if (options.poll_ms <= 0)
    return Status::InvalidArgument("Claims::Options::poll_ms must be > 0, got " + std::to_string(options.poll_ms));
  return std::unique_ptr<Claims>(new Claims(store, options));
}

void Claims::Tell(const ClaimRequest& request, const Result<ClaimOutcome>& outcome) const {
  if (options_.observer == nullptr || !outcome.ok()) return;
  Event e;
  switch (outcome->kind) {
    case ClaimOutcome::Kind::kStarted:
      e.kind = outcome->took_over ? EventKind::kClaimTakenOver : EventKind::kClaimStarted;
      break;
    case ClaimOutcome::Kind::kCompleted: e.kind = EventKind::kClaimReplayed; break;
    case ClaimOutcome::Kind::kInProgress: e.kind = EventKind::kClaimInProgress; break;
    case ClaimOutcome::Kind::kConflict: e.kind = EventKind::kClaimConflict; break;
  }
  e.consumer = request.scope;
  e.message_id = request.key;
  e.at_ms = options_.env->NowMs();
  options_.observer->OnEvent(e);
}

Status Claims::Told(const ClaimToken& token, Status written, EventKind ok_kind) const {
  if (options_.observer == nullptr || !(written.ok() || written.code() == Code::kLeaseLost)) return written;
  Event e;
  e.kind = written.ok() ? ok_kind : EventKind::kClaimFenced;
  e.consumer = token.scope;
  e.message_id = token.key;
  if (!written.ok()) e.detail = written.message();
  e.at_ms = options_.env->NowMs();
  options_.observer->OnEvent(e);
  return written;
}

Result<ClaimOutcome> Claims::Claim(const ClaimRequest& request) {
  IDEM_RETURN_IF_ERROR(ValidateRequest(request));
  Env* env = options_.env;
  const int64_t deadline = internal::SaturatingAdd(env->NowMs(), request.wait_ms);
  if (request.wait_ms == 0) {
    Result<ClaimOutcome> c = store_.TryClaim(request);
    Tell(request, c);
    return c;
  }
  // Watch before the first read, so a completion right after it wakes us.
  std::unique_ptr<ClaimStore::Watch> watch = store_.WatchKey(request.scope, request.key);
  for (;;) {
    Result<ClaimOutcome> c = store_.TryClaim(request);
    const int64_t left = deadline - env->NowMs();
    if (!c.ok() || c->kind != ClaimOutcome::Kind::kInProgress || left <= 0) {
      Tell(request, c);
      return c;
    }
    // Until woken by a change, or the next poll (a change made by another
    // process the watch cannot hear, or the holder's lease running out).
    watch->Wait(std::min(left, options_.poll_ms));
  }
}

std::vector<Result<ClaimOutcome>> Claims::ClaimMany(std::span<const ClaimRequest> requests) {
  std::vector<Result<ClaimOutcome>> out(requests.size(), Status::Internal("not claimed"));
  std::vector<ClaimRequest> valid;
  std::vector<size_t> where;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (Status s = ValidateRequest(requests[i]); !s.ok()) {
      out[i] = std::move(s);
    } else {
      where.push_back(i);
    }
  }
  // The store sees the valid requests only (copied only when some are not).
  const bool all_valid = where.size() == requests.size();
  if (!all_valid)
    for (size_t i : where) valid.push_back(requests[i]);
  auto claimed = store_.TryClaimMany(all_valid ? requests : std::span<const ClaimRequest>(valid));
  for (size_t k = 0; k < claimed.size(); ++k) out[where[k]] = std::move(claimed[k]);
  // Keys in progress that may be waited for: as Claim does, one by one
  // (Claim tells the observer of those).
  for (size_t i : where) {
    if (requests[i].wait_ms > 0 && out[i].ok() && out[i]->kind == ClaimOutcome::Kind::kInProgress) {
      out[i] = Claim(requests[i]);
    } else {
      Tell(requests[i], out[i]);
    }
  }
  return out;
}

std::vector<Status> Claims::CompleteMany(std::span<const Completion> completions) {
  for (const Completion& c : completions)
    if (c.token == nullptr)
      return std::vector<Status>(completions.size(), Status::InvalidArgument("a Completion without a token"));
  std::vector<Status> out = store_.CompleteMany(completions, options_.retention_ms);
  for (size_t i = 0; i < out.size() && i < completions.size(); ++i)
    (void)Told(*completions[i].token, out[i], EventKind::kClaimCompleted);
  return out;
}

namespace {
// What a claim's holder learns from the store when it finishes or extends
// the claim, with the kill points of both outcomes: the store has done its
// part (a crash leaves the holder without the answer), or it refused the
// holder as fenced.
Status Learned(Status s, bool finished) {
  if (s.code() == Code::kLeaseLost) IDEM_KILL_POINT("claims.lease_lost");
  if (finished) IDEM_KILL_POINT("claims.finish_done");
  return s;
}
}  // namespace

Status Claims::Complete(const ClaimToken& token, std::string_view result) {
  return Told(token, Learned(store_.Complete(token, result, /*is_error=*/false, options_.retention_ms), true),
              EventKind::kClaimCompleted);
}

Status Claims::Fail(const ClaimToken& token, FailPolicy policy, std::string_view error) {
  if (policy == FailPolicy::kRelease)
    return Told(token, Learned(store_.Release(token), true), EventKind::kClaimReleased);
  return Told(token, Learned(store_.Complete(token, error, /*is_error=*/true, options_.retention_ms), true),
              EventKind::kClaimCompleted);
}

Status Claims::Extend(ClaimToken& token, int64_t lease_ms) {
  if (lease_ms <= 0) return Status::InvalidArgument("lease_ms must be > 0, got " + std::to_string(lease_ms));
  Result<int64_t> until = store_.Extend(token, lease_ms);
  if (!until.ok()) (void)Told(token, until.status(), EventKind::kClaimFenced);
  IDEM_RETURN_IF_ERROR(Learned(until.status(), false));
  token.lease_until_ms = *until;
  return Status::OK();
}

Result<std::string> CallOnce(Claims& claims, const Message& message, std::string_view step,
                             const std::function<Result<std::string>(const std::string& downstream_key)>& call,
                             const CallOnceOptions& options) {
  IDEM_RETURN_IF_ERROR(ValidateStep(step).WithContext("CallOnce"));
  const std::string key = DownstreamKey(message, step);
  const std::string what =
      "step '" + std::string(step) + "' of message " + Printable(message.id) + " (key " + Printable(key) + ")";
  if (const std::string* held = internal::HeldWriteLock(); held != nullptr && *held == claims.store().WriteLockId()) {
    // SQLite has one writer per file, and the inbox's transaction is it
    // until it commits: the claim's commit would wait on it (the in-process
    // write gate, then SQLite's lock) for busy_timeout_ms and fail busy, on
    // every delivery. No message can ever apply so: refused as the set-up's
    // mistake (the Inbox commits and counts nothing, a Consumer stops).
    Status refused = Status::InvalidArgument(
        what + ": its claims are kept in " + *held +
        ", whose write lock the inbox's transaction holds while the handler runs, so committing the claim would wait "
        "for itself. Keep the claims in a file of their own, or make the call first with idem::CallFirst "
        "(idem/call_first.h)");
    internal::RefuseSetup(refused);
    return refused;
  }
  IDEM_ASSIGN_OR_RETURN(ClaimOutcome c, claims.Claim(ClaimRequest{.scope = std::string(step),
                                                                  .key = key,
                                                                  .fingerprint = FingerprintOf(message.payload),
                                                                  .lease_ms = options.lease_ms,
                                                                  .wait_ms = options.wait_ms}));
  switch (c.kind) {
    case ClaimOutcome::Kind::kCompleted:
      if (c.result_is_error)
        return Status::HandlerFailed(what + " failed before, and its failure is final: " + c.result);
      return std::move(c.result);
    case ClaimOutcome::Kind::kInProgress:
      return Status::InProgress(what + " is running in another delivery (its lease ends at " +
                                std::to_string(c.retry_at_ms) + " ms); deliver it again later");
    case ClaimOutcome::Kind::kConflict:
      return Status::Conflict(what + ": its key was used for another payload (stored fingerprint " +
                              ToHex(c.stored_fingerprint) + ")");
    case ClaimOutcome::Kind::kStarted: break;
  }
  Result<std::string> r = call(key);
  if (!r.ok()) {
    const Code code = r.status().code();
    // In progress or in doubt downstream: the call may have taken effect and
    // is not finished. Nothing final is stored: the claim is released and
    // the redelivery calls again with the same key (the receiver replays or
    // says in progress again). Stopping: the same, without a verdict.
    const bool unfinished = code == Code::kInProgress || code == Code::kInDoubt || code == Code::kAborted;
    const FailPolicy policy = unfinished ? FailPolicy::kRelease : options.on_error;
    Status failed = claims.Fail(c.token, policy, r.status().ToString());
    Status out = code == Code::kAborted ? r.status().WithContext(what)
                 : unfinished ? Status::InProgress(what + " may have taken effect downstream and is not finished (" +
                                                   r.status().ToString() + "); deliver it again later")
                              : r.status().WithContext(what);
    if (!failed.ok() && failed.code() != Code::kLeaseLost)
      return Status(out.code(), out.message() + " (and recording its failure failed: " + failed.ToString() + ")");
    return out;
  }
  // If the lease was lost meanwhile, another delivery owns the step now and
  // its result is the one that counts: fail, and the redelivery replays it.
  IDEM_RETURN_IF_ERROR(claims.Complete(c.token, *r).WithContext(what));
  return r;
}

Result<std::string> Calls::Once(std::string_view step,
                                const std::function<Result<std::string>(const std::string& downstream_key)>& call,
                                const CallOnceOptions& options) {
  Result<std::string> r = CallOnce(claims_, message_, step, call, options);
  if (r.ok()) results_.insert_or_assign(std::string(step), *r);
  return r;
}

const std::string* Calls::Find(std::string_view step) const {
  auto it = results_.find(step);
  return it == results_.end() ? nullptr : &it->second;
}

const std::string& Calls::at(std::string_view step) const {
  if (const std::string* r = Find(step)) return *r;
  throw std::out_of_range("call-first: no result for step '" + std::string(step) +
                          "' (its Calls::Once did not run or did not succeed)");
}

}  // namespace idem
