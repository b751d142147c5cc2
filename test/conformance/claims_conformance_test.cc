// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The claims conformance suite: every ClaimStore (SQLite, PostgreSQL, Redis)
// passes these. The store's clock is a FakeEnv: leases expire when a test
// advances it, and nothing sleeps. Every key is claimed at least twice.
#include <atomic>
#include <condition_variable>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "idem/claims.h"
#include "util/claims_conformance.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

using Kind = ClaimOutcome::Kind;

constexpr int64_t kLease = 30'000;

ClaimRequest Req(std::string key, std::string_view body = "body", int64_t lease = kLease) {
  return ClaimRequest{.scope = "charges", .key = std::move(key), .fingerprint = FingerprintOf(body), .lease_ms = lease};
}

TEST_P(ClaimsConformance, NewKeyStartsAndIsCompletedOnceThenReplayed) {
  auto claims_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  auto first = claims.Claim(Req("k1"));
  ASSERT_OK(first);
  ASSERT_EQ(first->kind, Kind::kStarted);
  EXPECT_GT(first->token.fence, 0);
  EXPECT_EQ(first->token.lease_until_ms, env_.NowMs() + kLease);
  EXPECT_FALSE(first->took_over);
  ASSERT_TRUE(claims.Complete(first->token, "receipt-1").ok());
  for (int delivery = 0; delivery < 2; ++delivery) {
    auto again = claims.Claim(Req("k1"));
    ASSERT_OK(again);
    EXPECT_EQ(again->kind, Kind::kCompleted);
    EXPECT_EQ(again->result, "receipt-1");
    EXPECT_FALSE(again->result_is_error);
  }
  auto rec = store_->FindClaim("charges", "k1");
  ASSERT_TRUE(rec.ok() && rec->has_value()) << rec.status();
  EXPECT_EQ((*rec)->state, ClaimRecord::State::kCompleted);
  EXPECT_EQ((*rec)->fence, first->token.fence);
  EXPECT_EQ((*rec)->expires_at_ms, env_.NowMs() + claims.options().retention_ms);
}

// ClaimMany / CompleteMany answer every key as Claim / Complete would one by
// one, whatever else is in the batch: new, completed, held, expired, another
// body, invalid, and the same key twice.
TEST_P(ClaimsConformance, ManyClaimsAnswerEachKeyAsOneByOne) {
  auto claims_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  auto done = claims.Claim(Req("m-done"));
  auto held = claims.Claim(Req("m-held"));
  auto expired = claims.Claim(Req("m-expired", "body", 1'000));
  ASSERT_TRUE(done.ok() && held.ok() && expired.ok());
  ASSERT_TRUE(claims.Complete(done->token, "receipt-done").ok());
  env_.Advance(1'000);  // m-expired's lease is over; m-held's is live

  const std::vector<ClaimRequest> batch = {
      Req("m-new1"),  Req("m-done"),  Req("m-held"), Req("m-done", "another body"), Req("m-expired"), Req(""),
      Req("m-twice"), Req("m-twice"), Req("m-new2")};
  auto out = claims.ClaimMany(batch);
  ASSERT_EQ(out.size(), batch.size());
  for (size_t i : {0u, 1u, 2u, 3u, 4u, 6u, 7u, 8u}) ASSERT_TRUE(out[i].ok()) << i << ": " << out[i].status();
  EXPECT_EQ(out[0]->kind, Kind::kStarted);
  EXPECT_EQ(out[1]->kind, Kind::kCompleted);
  EXPECT_EQ(out[1]->result, "receipt-done");
  EXPECT_EQ(out[2]->kind, Kind::kInProgress);
  EXPECT_EQ(out[2]->retry_at_ms, held->token.lease_until_ms);
  EXPECT_EQ(out[3]->kind, Kind::kConflict);
  EXPECT_EQ(out[4]->kind, Kind::kStarted);
  EXPECT_TRUE(out[4]->took_over);
  EXPECT_GT(out[4]->token.fence, expired->token.fence);
  EXPECT_EQ(out[5].status().code(), Code::kInvalidArgument);
  // The same key twice in one batch: one starts, the other finds it held.
  EXPECT_EQ((out[6]->kind == Kind::kStarted) + (out[7]->kind == Kind::kStarted), 1);
  EXPECT_EQ((out[6]->kind == Kind::kInProgress) + (out[7]->kind == Kind::kInProgress), 1);
  EXPECT_EQ(out[8]->kind, Kind::kStarted);
  EXPECT_NE(out[0]->token.fence, out[8]->token.fence);

  const ClaimToken& twice = out[6]->kind == Kind::kStarted ? out[6]->token : out[7]->token;
  const std::vector<Completion> completions = {{.token = &out[0]->token, .result = "r-new1"},
                                               {.token = &expired->token, .result = "stale"},  // fenced
                                               {.token = &out[4]->token, .result = "r-expired"},
                                               {.token = &twice, .result = "failed", .is_error = true},
                                               {.token = &out[8]->token, .result = "r-new2"}};
  auto statuses = claims.CompleteMany(completions);
  ASSERT_EQ(statuses.size(), completions.size());
  EXPECT_TRUE(statuses[0].ok()) << statuses[0];
  EXPECT_EQ(statuses[1].code(), Code::kLeaseLost) << statuses[1];
  EXPECT_TRUE(statuses[2].ok()) << statuses[2];
  EXPECT_TRUE(statuses[3].ok()) << statuses[3];
  EXPECT_TRUE(statuses[4].ok()) << statuses[4];

  // Delivered again, one by one and as a batch: every key replays.
  const std::vector<ClaimRequest> again = {Req("m-new1"), Req("m-expired"), Req("m-twice"), Req("m-new2")};
  const std::vector<std::string> want = {"r-new1", "r-expired", "failed", "r-new2"};
  auto replays = claims.ClaimMany(again);
  for (size_t i = 0; i < again.size(); ++i) {
    auto single = claims.Claim(again[i]);
    for (const auto* r : {&replays[i], &single}) {
      ASSERT_TRUE(r->ok()) << r->status();
      EXPECT_EQ((*r)->kind, Kind::kCompleted) << again[i].key;
      EXPECT_EQ((*r)->result, want[i]);
      EXPECT_EQ((*r)->result_is_error, i == 2);
    }
  }
  EXPECT_TRUE(claims.ClaimMany({}).empty());
  EXPECT_TRUE(claims.CompleteMany({}).empty());
}

TEST_P(ClaimsConformance, ResultsAreBinarySafe) {
  auto claims_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  const std::string result("a\0b\xff\n", 5);
  auto c = claims.Claim(Req("bin"));
  ASSERT_TRUE(c.ok() && c->kind == Kind::kStarted);
  ASSERT_TRUE(claims.Complete(c->token, result).ok());
  auto again = claims.Claim(Req("bin"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->result, result);
}

TEST_P(ClaimsConformance, SecondClaimWhileLeaseIsLiveIsInProgress) {
  auto claims_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  auto first = claims.Claim(Req("k2"));
  ASSERT_TRUE(first.ok() && first->kind == Kind::kStarted);
  env_.Advance(kLease - 1);
  auto second = claims.Claim(Req("k2"));
  ASSERT_OK(second);
  EXPECT_EQ(second->kind, Kind::kInProgress);
  EXPECT_EQ(second->retry_at_ms, first->token.lease_until_ms);
}

TEST_P(ClaimsConformance, SameKeyOtherFingerprintIsAConflictOnEveryPath) {
  auto claims_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  auto first = claims.Claim(Req("k3", "pay $40"));
  ASSERT_TRUE(first.ok() && first->kind == Kind::kStarted);
  auto in_progress = claims.Claim(Req("k3", "pay $80"));  // live lease
  ASSERT_TRUE(in_progress.ok());
  EXPECT_EQ(in_progress->kind, Kind::kConflict);
  EXPECT_EQ(in_progress->stored_fingerprint, FingerprintOf("pay $40"));
  env_.Advance(kLease);  // lease over: still not yours with another body
  auto expired = claims.Claim(Req("k3", "pay $80"));
  ASSERT_TRUE(expired.ok());
  EXPECT_EQ(expired->kind, Kind::kConflict);
  auto owner = claims.Claim(Req("k3", "pay $40"));
  ASSERT_TRUE(owner.ok() && owner->kind == Kind::kStarted);
  ASSERT_TRUE(claims.Complete(owner->token, "done").ok());
  auto completed = claims.Claim(Req("k3", "pay $80"));
  ASSERT_TRUE(completed.ok());
  EXPECT_EQ(completed->kind, Kind::kConflict);
  EXPECT_TRUE(completed->result.empty());  // another body never sees the result
}

TEST_P(ClaimsConformance, ExpiredLeaseIsTakenOverAndTheStaleHolderIsFenced) {
  auto claims_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  auto paused = claims.Claim(Req("k4"));
  ASSERT_TRUE(paused.ok() && paused->kind == Kind::kStarted);
  env_.Advance(kLease);  // the holder pauses past its lease
  auto taker = claims.Claim(Req("k4"));
  ASSERT_OK(taker);
  ASSERT_EQ(taker->kind, Kind::kStarted);
  EXPECT_TRUE(taker->took_over);
  EXPECT_GT(taker->token.fence, paused->token.fence);

  // The stale holder wakes up: every write it tries is refused.
  Status done = claims.Complete(paused->token, "stale result");
  EXPECT_EQ(done.code(), Code::kLeaseLost) << done;
  EXPECT_NE(done.message().find("taken over by fence " + std::to_string(taker->token.fence)), std::string::npos)
      << done;
  ClaimToken stale = paused->token;
  EXPECT_EQ(claims.Extend(stale, kLease).code(), Code::kLeaseLost);
  EXPECT_EQ(claims.Fail(paused->token, FailPolicy::kRelease, "boom").code(), Code::kLeaseLost);
  EXPECT_EQ(claims.Fail(paused->token, FailPolicy::kStoreError, "boom").code(), Code::kLeaseLost);

  ASSERT_TRUE(claims.Complete(taker->token, "fresh result").ok());
  EXPECT_EQ(claims.Complete(paused->token, "stale result").code(), Code::kLeaseLost);  // after completion too
  auto replay = claims.Claim(Req("k4"));
  ASSERT_TRUE(replay.ok());
  EXPECT_EQ(replay->kind, Kind::kCompleted);
  EXPECT_EQ(replay->result, "fresh result");
}

TEST_P(ClaimsConformance, HolderPastItsLeaseMayCompleteWhenNobodyTookOver) {
  auto claims_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  auto c = claims.Claim(Req("k5"));
  ASSERT_TRUE(c.ok() && c->kind == Kind::kStarted);
  env_.Advance(kLease * 3);
  ASSERT_TRUE(claims.Complete(c->token, "late but unique").ok());
  ASSERT_TRUE(claims.Complete(c->token, "late but unique").ok()) << "a retried Complete is fine";
  auto replay = claims.Claim(Req("k5"));
  ASSERT_TRUE(replay.ok());
  EXPECT_EQ(replay->kind, Kind::kCompleted);
  EXPECT_EQ(replay->result, "late but unique");
}

TEST_P(ClaimsConformance, ExtendKeepsTheKeyAcrossItsOriginalLease) {
  auto claims_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  auto c = claims.Claim(Req("k6"));
  ASSERT_TRUE(c.ok() && c->kind == Kind::kStarted);
  ClaimToken token = c->token;
  env_.Advance(kLease - 1000);
  ASSERT_TRUE(claims.Extend(token, kLease).ok());
  EXPECT_EQ(token.lease_until_ms, env_.NowMs() + kLease);
  env_.Advance(kLease - 1);  // past the first lease, inside the extended one
  auto other = claims.Claim(Req("k6"));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->kind, Kind::kInProgress);
  EXPECT_EQ(other->retry_at_ms, token.lease_until_ms);
  ASSERT_TRUE(claims.Complete(token, "r").ok());
  EXPECT_EQ(claims.Extend(token, kLease).code(), Code::kLeaseLost) << "a completed key has no lease";
}

TEST_P(ClaimsConformance, ReleaseLetsTheNextCallRunTheWorkAgain) {
  auto claims_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  auto first = claims.Claim(Req("k7"));
  ASSERT_TRUE(first.ok() && first->kind == Kind::kStarted);
  ASSERT_TRUE(claims.Fail(first->token, FailPolicy::kRelease, "provider said 503").ok());
  auto rec = store_->FindClaim("charges", "k7");
  ASSERT_TRUE(rec.ok());
  EXPECT_FALSE(rec->has_value());
  auto second = claims.Claim(Req("k7"));
  ASSERT_TRUE(second.ok() && second->kind == Kind::kStarted);
  EXPECT_GT(second->token.fence, first->token.fence);
  Status stale = claims.Fail(first->token, FailPolicy::kRelease, "again");
  EXPECT_EQ(stale.code(), Code::kLeaseLost) << stale;
  ASSERT_TRUE(claims.Complete(second->token, "ok").ok());
}

TEST_P(ClaimsConformance, StoredFailureIsReplayedAsAnError) {
  auto claims_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  auto c = claims.Claim(Req("k8"));
  ASSERT_TRUE(c.ok() && c->kind == Kind::kStarted);
  ASSERT_TRUE(claims.Fail(c->token, FailPolicy::kStoreError, "card declined").ok());
  for (int delivery = 0; delivery < 2; ++delivery) {
    auto replay = claims.Claim(Req("k8"));
    ASSERT_TRUE(replay.ok());
    EXPECT_EQ(replay->kind, Kind::kCompleted);
    EXPECT_TRUE(replay->result_is_error);
    EXPECT_EQ(replay->result, "card declined");
  }
}

// A result kept for no time would let the work run again at once: Claims
// with retention_ms <= 0 cannot be opened, so they start no work at all.
TEST_P(ClaimsConformance, ClaimsThatKeepNoResultStartNoWork) {
  for (int64_t retention : {int64_t{0}, int64_t{-1}}) {
    auto c = Claims::Open(*store_, Claims::Options{.retention_ms = retention, .env = &env_});
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
    EXPECT_NE(c.status().message().find("retention_ms"), std::string::npos) << c.status();
  }
  EXPECT_EQ(Claims::Open(*store_, Claims::Options{.poll_ms = 0, .env = &env_}).status().code(), Code::kInvalidArgument);
  auto rec = store_->FindClaim("charges", "no-retention");
  ASSERT_OK(rec);
  EXPECT_FALSE(rec->has_value());  // nothing was claimed
  // A wait "for ever" does not overflow the deadline.
  auto claims_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  auto held = claims.Claim(Req("forever"));
  ASSERT_TRUE(held.ok() && held->kind == Kind::kStarted);
  ASSERT_TRUE(claims.Complete(held->token, "done").ok());
  ClaimRequest waiting = Req("forever");
  waiting.wait_ms = std::numeric_limits<int64_t>::max();
  auto replay = claims.Claim(waiting);
  ASSERT_OK(replay);
  EXPECT_EQ(replay->kind, Kind::kCompleted);
}

TEST_P(ClaimsConformance, CompletedRecordsExpireAfterRetentionAndArePurged) {
  auto claims_owned = MustOpen<Claims>(*store_, Claims::Options{.retention_ms = 3'600'000, .env = &env_});
  Claims& claims = *claims_owned;
  auto c = claims.Claim(Req("old"));
  ASSERT_TRUE(c.ok() && c->kind == Kind::kStarted);
  ASSERT_TRUE(claims.Complete(c->token, "r").ok());
  auto abandoned = claims.Claim(Req("abandoned"));
  ASSERT_TRUE(abandoned.ok() && abandoned->kind == Kind::kStarted);
  env_.Advance(3'600'000 - 1);
  auto still = claims.Claim(Req("old", "another body"));
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->kind, Kind::kConflict);
  auto purged_early = store_->PurgeClaims("", /*abandoned_after_ms=*/3'600'000, 100);
  ASSERT_OK(purged_early);
  EXPECT_EQ(*purged_early, 0);

  env_.Advance(kLease + 1);  // result expired; the abandoned lease ended an hour ago
  auto purged = store_->PurgeClaims("", 3'600'000, 1);
  ASSERT_OK(purged);
  EXPECT_EQ(*purged, 2);
  auto gone = store_->FindClaim("charges", "old");
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value());
  auto fresh = claims.Claim(Req("old", "another body"));  // the key is free again
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->kind, Kind::kStarted);
  EXPECT_GT(fresh->token.fence, abandoned->token.fence) << "fences keep growing after a purge";
}

TEST_P(ClaimsConformance, ExpiredResultNotYetPurgedCountsAsAbsent) {
  auto claims_owned = MustOpen<Claims>(*store_, Claims::Options{.retention_ms = 1000, .env = &env_});
  Claims& claims = *claims_owned;
  auto c = claims.Claim(Req("k9", "v1"));
  ASSERT_TRUE(c.ok() && c->kind == Kind::kStarted);
  ASSERT_TRUE(claims.Complete(c->token, "r1").ok());
  env_.Advance(1000);
  auto again = claims.Claim(Req("k9", "v2"));
  ASSERT_OK(again);
  ASSERT_EQ(again->kind, Kind::kStarted);
  EXPECT_FALSE(again->took_over);
  EXPECT_GT(again->token.fence, c->token.fence);
  EXPECT_EQ(claims.Complete(c->token, "r1").code(), Code::kLeaseLost);
  ASSERT_TRUE(claims.Complete(again->token, "r2").ok());
  auto replay = claims.Claim(Req("k9", "v2"));
  ASSERT_TRUE(replay.ok());
  EXPECT_EQ(replay->result, "r2");
}

TEST_P(ClaimsConformance, ScopesAreSeparate) {
  auto claims_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  ClaimRequest a = Req("same-key");
  ClaimRequest b = Req("same-key");
  b.scope = "refunds";
  for (int delivery = 0; delivery < 2; ++delivery) {
    auto ca = claims.Claim(a);
    auto cb = claims.Claim(b);
    ASSERT_TRUE(ca.ok() && cb.ok());
    EXPECT_EQ(ca->kind, delivery == 0 ? Kind::kStarted : Kind::kInProgress);
    EXPECT_EQ(cb->kind, delivery == 0 ? Kind::kStarted : Kind::kInProgress);
  }
  auto listed = store_->ListClaims("refunds", 10);
  ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].scope, "refunds");
  auto all = store_->ListClaims("", 10);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 2u);
  // A negative limit is refused, not read as "all" (SQL's LIMIT -1).
  EXPECT_EQ(store_->ListClaims("", -1).status().code(), Code::kInvalidArgument);
  auto none = store_->ListClaims("", 0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST_P(ClaimsConformance, BadRequestsAreRefusedBeforeTheStore) {
  auto claims_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  EXPECT_EQ(claims.Claim(Req("")).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(claims.Claim(Req(std::string(256, 'k'))).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(claims.Claim(Req("k", "b", 0)).status().code(), Code::kInvalidArgument);
  ClaimRequest no_scope = Req("k");
  no_scope.scope.clear();
  Status s = claims.Claim(no_scope).status();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("scope"), std::string::npos) << s;
}

TEST_P(ClaimsConformance, ManyThreadsClaimingOneKeyStartOnce) {
  constexpr int kThreads = 64;
  auto claims_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  std::atomic<int> started{0}, in_progress{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int delivery = 0; delivery < 2; ++delivery) {
        auto c = claims.Claim(Req("hot"));
        if (!c.ok()) {
          ++errors;
          ADD_FAILURE() << c.status();
        } else if (c->kind == Kind::kStarted) {
          ++started;
        } else if (c->kind == Kind::kInProgress) {
          ++in_progress;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(started.load(), 1);
  EXPECT_EQ(in_progress.load(), 2 * kThreads - 1);
  EXPECT_EQ(errors.load(), 0);
}

TEST_P(ClaimsConformance, ConcurrentTakeoversOfAnExpiredLeaseStartOnce) {
  auto claims_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& claims = *claims_owned;
  auto first = claims.Claim(Req("expired-hot"));
  ASSERT_TRUE(first.ok() && first->kind == Kind::kStarted);
  env_.Advance(kLease);
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&] {
      for (int delivery = 0; delivery < 2; ++delivery) {
        auto c = claims.Claim(Req("expired-hot"));
        if (c.ok() && c->kind == Kind::kStarted) ++started;
        if (!c.ok()) ADD_FAILURE() << c.status();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(started.load(), 1);
}

// Counts TryClaim answers so a test can act once a waiter has read the key.
class ObservedStore final : public ClaimStore {
 public:
  explicit ObservedStore(ClaimStore& inner) : inner_(inner) {}
  Result<ClaimOutcome> TryClaim(const ClaimRequest& r) override {
    auto c = inner_.TryClaim(r);
    {
      std::lock_guard lock(mu_);
      ++reads_;
    }
    cv_.notify_all();
    return c;
  }
  void AwaitReads(int n) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return reads_ >= n; });
  }
  Status Complete(const ClaimToken& t, std::string_view r, bool e, int64_t ret) override {
    return inner_.Complete(t, r, e, ret);
  }
  Status Release(const ClaimToken& t) override { return inner_.Release(t); }
  Result<int64_t> Extend(const ClaimToken& t, int64_t l) override { return inner_.Extend(t, l); }
  Result<std::optional<ClaimRecord>> FindClaim(std::string_view s, std::string_view k) override {
    return inner_.FindClaim(s, k);
  }
  Result<std::vector<ClaimRecord>> ListClaims(std::string_view s, int l) override { return inner_.ListClaims(s, l); }
  Result<int64_t> PurgeClaims(std::string_view s, int64_t a, int b) override { return inner_.PurgeClaims(s, a, b); }
  Result<int64_t> NowMs() override { return inner_.NowMs(); }
  std::unique_ptr<Watch> WatchKey(std::string_view s, std::string_view k) override { return inner_.WatchKey(s, k); }

 private:
  ClaimStore& inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  int reads_ = 0;
};

TEST_P(ClaimsConformance, BoundedWaitIsWokenByTheCompletion) {
  ObservedStore observed(*store_);
  // Polls an hour apart and a clock that does not move: only the store's
  // wake-up can end this wait.
  auto waiting_owned = MustOpen<Claims>(observed, Claims::Options{.poll_ms = 3'600'000, .env = &env_});
  Claims& waiting = *waiting_owned;
  auto holding_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& holding = *holding_owned;
  auto holder = holding.Claim(Req("slow"));
  ASSERT_TRUE(holder.ok() && holder->kind == Kind::kStarted);
  Result<ClaimOutcome> waited = Status::Internal("not run");
  std::thread duplicate([&] {
    ClaimRequest r = Req("slow");
    r.wait_ms = 3'600'000;
    waited = waiting.Claim(r);
  });
  observed.AwaitReads(1);  // the duplicate saw it in progress and waits
  ASSERT_TRUE(holding.Complete(holder->token, "the result").ok());
  duplicate.join();
  ASSERT_OK(waited);
  EXPECT_EQ(waited->kind, Kind::kCompleted);
  EXPECT_EQ(waited->result, "the result");
}

// A key in progress in a batch is waited for when its request says so; the
// others in the batch are answered as they are.
TEST_P(ClaimsConformance, ManyClaimsWaitForAKeyInProgressWhenAsked) {
  ObservedStore observed(*store_);
  auto waiting_owned = MustOpen<Claims>(observed, Claims::Options{.poll_ms = 3'600'000, .env = &env_});
  Claims& waiting = *waiting_owned;  // only the wake-up ends the wait
  auto holding_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& holding = *holding_owned;
  auto holder = holding.Claim(Req("w-held"));
  ASSERT_TRUE(holder.ok() && holder->kind == Kind::kStarted);
  ClaimRequest wait = Req("w-held");
  wait.wait_ms = 3'600'000;
  std::vector<Result<ClaimOutcome>> out;
  std::thread duplicate([&] { out = waiting.ClaimMany(std::vector<ClaimRequest>{Req("w-new"), wait}); });
  // The batch read both keys (2 reads), then the waiting Claim read w-held again.
  observed.AwaitReads(3);
  ASSERT_TRUE(holding.Complete(holder->token, "waited-for").ok());
  duplicate.join();
  ASSERT_EQ(out.size(), 2u);
  ASSERT_TRUE(out[0].ok() && out[1].ok());
  EXPECT_EQ(out[0]->kind, Kind::kStarted);
  EXPECT_EQ(out[1]->kind, Kind::kCompleted);
  EXPECT_EQ(out[1]->result, "waited-for");
}

TEST_P(ClaimsConformance, BoundedWaitIsWokenByARelease) {
  ObservedStore observed(*store_);
  auto waiting_owned = MustOpen<Claims>(observed, Claims::Options{.poll_ms = 3'600'000, .env = &env_});
  Claims& waiting = *waiting_owned;
  auto holding_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& holding = *holding_owned;
  auto holder = holding.Claim(Req("flaky"));
  ASSERT_TRUE(holder.ok() && holder->kind == Kind::kStarted);
  Result<ClaimOutcome> waited = Status::Internal("not run");
  std::thread duplicate([&] {
    ClaimRequest r = Req("flaky");
    r.wait_ms = 3'600'000;
    waited = waiting.Claim(r);
  });
  observed.AwaitReads(1);
  ASSERT_TRUE(holding.Fail(holder->token, FailPolicy::kRelease, "503").ok());
  duplicate.join();
  ASSERT_OK(waited);
  EXPECT_EQ(waited->kind, Kind::kStarted) << "the waiter runs the work after a release";
  EXPECT_GT(waited->token.fence, holder->token.fence);
}

TEST_P(ClaimsConformance, BoundedWaitEndsInProgressWhenItsTimeIsUp) {
  ObservedStore observed(*store_);
  auto waiting_owned = MustOpen<Claims>(observed, Claims::Options{.poll_ms = 1, .env = &env_});
  Claims& waiting = *waiting_owned;
  auto holding_owned = MustOpen<Claims>(*store_, Claims::Options{.env = &env_});
  Claims& holding = *holding_owned;
  auto holder = holding.Claim(Req("stuck"));
  ASSERT_TRUE(holder.ok() && holder->kind == Kind::kStarted);
  Result<ClaimOutcome> waited = Status::Internal("not run");
  std::thread duplicate([&] {
    ClaimRequest r = Req("stuck");
    r.wait_ms = 5'000;
    waited = waiting.Claim(r);
  });
  observed.AwaitReads(2);  // it polls
  env_.Advance(5'000);     // its time is up (the lease of 30 s is not)
  duplicate.join();
  ASSERT_OK(waited);
  EXPECT_EQ(waited->kind, Kind::kInProgress);
  EXPECT_EQ(waited->retry_at_ms, holder->token.lease_until_ms);
}

TEST_P(ClaimsConformance, StoreClockIsTheOneGiven) {
  auto now = store_->NowMs();
  ASSERT_OK(now);
  EXPECT_EQ(*now, env_.NowMs());
}

}  // namespace
}  // namespace idem::testing
