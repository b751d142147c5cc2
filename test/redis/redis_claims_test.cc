// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The Redis claim store on a real server (127.0.0.1, started by the CTest
// fixture "redis"): the claims conformance suite with a fake clock, plus what
// only a server has: the server's own clock, connection errors that name the
// address and never the password, many threads on one key, a watch woken
// from another process, a connection the server closed, key TTLs and
// binary-safe key names.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <span>
#include <thread>
#include <vector>

#include "idem/claims.h"
#include "idem/open.h"
#include "idem/redis/claim_store.h"
#include "idem/testing/fake_env.h"
#include "idem/url.h"
#include "redis/redis_test_util.h"
#include "util/claims_conformance.h"
#include "util/test_util.h"

namespace idem::testing {

INSTANTIATE_TEST_SUITE_P(Stores, ClaimsConformance,
                         ::testing::Values(ClaimsParam{
                             "redis",
                             [](const TempDir& d, Env* env) -> Result<std::shared_ptr<ClaimStore>> {
                               auto s =
                                   redis::ClaimStore::Open({.url = RedisUrl(), .prefix = PrefixFor(d), .clock = env});
                               if (!s.ok()) return s.status();
                               return std::shared_ptr<ClaimStore>(std::move(*s));
                             }}),
                         ClaimsParamName);

namespace {

using Kind = ClaimOutcome::Kind;

ClaimRequest Req(std::string key, std::string_view body = "body", int64_t lease = 30'000) {
  return ClaimRequest{.scope = "charges", .key = std::move(key), .fingerprint = FingerprintOf(body), .lease_ms = lease};
}

// A store on the server's clock (no fake), with keys of its own.
std::unique_ptr<redis::ClaimStore> OpenReal(redis::ClaimStore::Options o = {}) {
  if (o.url == redis::ClaimStore::Options{}.url) o.url = RedisUrl();
  if (o.prefix == redis::ClaimStore::Options{}.prefix) o.prefix = UniquePrefix();
  auto s = redis::ClaimStore::Open(o);
  EXPECT_OK(s);
  return s.ok() ? std::move(*s) : nullptr;
}

std::string WithUserInfo(const std::string& userinfo) {
  std::string url = RedisUrl();
  return "redis://" + userinfo + "@" + url.substr(std::string("redis://").size());
}

TEST(RedisClaimStore, UnreachableServerIsUnavailableNamingTheAddress) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto s = redis::ClaimStore::Open({.url = "redis://127.0.0.1:1", .connect_timeout_ms = 2'000});
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), Code::kUnavailable) << s.status();
    EXPECT_NE(s.status().message().find("127.0.0.1:1"), std::string::npos) << s.status();
  }
}

TEST(RedisClaimStore, BadUrlsAndOptionsAreInvalidArguments) {
  for (const char* url : {"http://127.0.0.1:6379", "redis://", "redis://:6379", "redis://h:0", "redis://h:65536",
                          "redis://h:port", "redis://h:1/db", "rediss://h:1", "redis://h:1?timeout=5",
                          "redis://[::1:6379", "redis://pw-no-colon@h:1", "redis://:pw%zz@h:1", "redis://:@h:1"}) {
    auto s = redis::ClaimStore::Open({.url = url});
    ASSERT_FALSE(s.ok()) << url;
    EXPECT_EQ(s.status().code(), Code::kInvalidArgument) << url << ": " << s.status();
    EXPECT_EQ(s.status().message().find("pw-no-colon"), std::string::npos) << s.status();
  }
  EXPECT_EQ(redis::ClaimStore::Open({.url = RedisUrl(), .client_name = "has space"}).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(redis::ClaimStore::Open({.url = RedisUrl(), .abandon_margin_ms = -1}).status().code(),
            Code::kInvalidArgument);
  auto no_db = redis::ClaimStore::Open({.url = RedisUrl() + "/100000"});
  EXPECT_EQ(no_db.status().code(), Code::kInvalidArgument) << no_db.status();
}

TEST(RedisClaimStore, WrongPasswordIsUnavailableAndNeverEchoed) {
  // An ACL user with another password, and the default user (which has none).
  for (const std::string userinfo : {"idem_pw:wrong-Secret-4711", ":wrong-Secret-4711"}) {
    for (int attempt = 0; attempt < 2; ++attempt) {
      auto s = redis::ClaimStore::Open({.url = WithUserInfo(userinfo)});
      ASSERT_FALSE(s.ok()) << userinfo;
      EXPECT_EQ(s.status().code(), Code::kUnavailable) << s.status();
      EXPECT_EQ(s.status().message().find("wrong-Secret-4711"), std::string::npos) << s.status();
      EXPECT_NE(s.status().message().find(RedisAddress()), std::string::npos) << s.status();
    }
  }
  // The right password works (AUTH user password).
  auto store = OpenReal({.url = WithUserInfo("idem_pw:secret")});
  ASSERT_NE(store, nullptr);
  for (int delivery = 0; delivery < 2; ++delivery) {
    auto c = store->TryClaim(Req("k"));
    ASSERT_OK(c);
    EXPECT_EQ(c->kind, delivery == 0 ? Kind::kStarted : Kind::kInProgress);
  }
  EXPECT_EQ(idem::RedactUrl("redis://idem_pw:secret@h:1/2"), "redis://idem_pw:***@h:1/2");
}

TEST(RedisClaimStoreUrl, KeysAreTheFieldsNames) {
  auto o = redis::ClaimStore::ParseUrl(
      "redis://u:pw@h:6380/2?prefix=app:&pool_size=3&connect_timeout_ms=700&command_timeout_ms=900"
      "&client_name=app&abandon_margin_ms=60000");
  ASSERT_OK(o);
  EXPECT_EQ(o->url, "redis://u:pw@h:6380/2");
  EXPECT_EQ(o->prefix, "app:");
  EXPECT_EQ(o->pool_size, 3);
  EXPECT_EQ(o->connect_timeout_ms, 700);
  EXPECT_EQ(o->command_timeout_ms, 900);
  EXPECT_EQ(o->client_name, "app");
  EXPECT_EQ(o->abandon_margin_ms, 60'000);
  auto plain = redis::ClaimStore::ParseUrl("redis://h");
  ASSERT_OK(plain);
  EXPECT_EQ(plain->prefix, redis::ClaimStore::Options{}.prefix);
  for (const char* bad :
       {"redis://:s3cret@h?colour=blue", "redis://:s3cret@h?pool_size=0", "redis://:s3cret@h?prefix=a&prefix=b",
        "redis://:s3cret@h:notaport", "sqlite:x.db", "redis://:s3cret@h?connect_timeout_ms=soon"}) {
    auto r = redis::ClaimStore::ParseUrl(bad);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_EQ(r.status().message().find("s3cret"), std::string::npos) << r.status();
  }
}

TEST(RedisClaimStoreUrl, OpenClaimStoreByUrl) {
  auto store = idem::OpenClaimStore(RedisUrl() + "?prefix=" + UniquePrefix() + "&pool_size=2");
  ASSERT_OK(store);
  auto c = (*store)->TryClaim(Req("by-url"));
  ASSERT_OK(c);
  EXPECT_EQ(c->kind, Kind::kStarted);
  EXPECT_EQ(idem::OpenStore(RedisUrl()).status().code(), Code::kInvalidArgument);
}

TEST(RedisClaimStoreUrl, OpenChecksTheOptions) {
  for (redis::ClaimStore::Options o :
       {redis::ClaimStore::Options{.pool_size = 0}, redis::ClaimStore::Options{.connect_timeout_ms = 0},
        redis::ClaimStore::Options{.command_timeout_ms = -1}, redis::ClaimStore::Options{.abandon_margin_ms = -1}}) {
    o.url = "redis://:s3cret@127.0.0.1:1";
    auto r = redis::ClaimStore::Open(o);
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << r.status();
    EXPECT_EQ(r.status().message().find("s3cret"), std::string::npos) << r.status();
  }
}

TEST(RedisClaimStore, LeasesAreJudgedByTheServersClock) {
  auto store = OpenReal();
  ASSERT_NE(store, nullptr);
  auto before = store->NowMs();
  ASSERT_OK(before);
  auto c = store->TryClaim(Req("k", "b", 60'000));
  ASSERT_TRUE(c.ok() && c->kind == Kind::kStarted) << c.status();
  auto after = store->NowMs();
  ASSERT_TRUE(after.ok());
  // A new key's lease starts at this process's estimate of the server's clock
  // (the last TIME reply carried forward on the steady clock, both read in
  // whole ms): within a few ms of the server's TIME around the call.
  constexpr int64_t kEstimateSlackMs = 5;
  EXPECT_GE(c->token.lease_until_ms, *before + 60'000 - kEstimateSlackMs);
  EXPECT_LE(c->token.lease_until_ms, *after + 60'000 + kEstimateSlackMs);
  auto again = store->TryClaim(Req("k", "b", 60'000));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->kind, Kind::kInProgress);
  EXPECT_EQ(again->retry_at_ms, c->token.lease_until_ms);
}

TEST(RedisClaimStore, SixtyFourThreadsClaimingOneKeyStartOnce) {
  auto store = OpenReal({.pool_size = 4});
  ASSERT_NE(store, nullptr);
  std::atomic<int> started{0}, in_progress{0}, other{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 64; ++t) {
    threads.emplace_back([&] {
      for (int delivery = 0; delivery < 2; ++delivery) {
        auto c = store->TryClaim(Req("hot"));
        if (c.ok() && c->kind == Kind::kStarted) {
          ++started;
        } else if (c.ok() && c->kind == Kind::kInProgress) {
          ++in_progress;
        } else {
          ++other;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(started.load(), 1);
  EXPECT_EQ(in_progress.load(), 127);
  EXPECT_EQ(other.load(), 0);
}

// Batches from many threads share the pipelined connections with single
// calls: every key starts once, whichever path claimed it, and every
// completion lands.
std::string Key(int k) { return std::string("b").append(std::to_string(k)); }

TEST(RedisClaimStore, BatchesAndSingleCallsFromManyThreadsStartEachKeyOnce) {
  auto store = OpenReal({.pool_size = 4});
  ASSERT_NE(store, nullptr);
  Claims claims(*store);
  constexpr int kKeys = 256, kThreads = 8;
  std::vector<std::atomic<int>> started(kKeys);
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int delivery = 0; delivery < 2; ++delivery) {
        for (int k0 = 0; k0 < kKeys; k0 += 16) {
          std::vector<ClaimRequest> reqs;
          for (int k = k0; k < k0 + 16; ++k) reqs.push_back(Req(Key((k + t * 16) % kKeys)));
          std::vector<Result<ClaimOutcome>> out;
          if (t % 2 == 0) {
            out = claims.ClaimMany(reqs);
          } else {
            for (const auto& r : reqs) out.push_back(claims.Claim(r));
          }
          std::vector<Completion> done;
          std::vector<std::string> results(reqs.size());
          for (size_t i = 0; i < out.size(); ++i) {
            if (!out[i].ok()) {
              ++errors;
            } else if (out[i]->kind == Kind::kStarted) {
              ++started[std::stoi(reqs[i].key.substr(1))];
              results[i] = std::string("r-").append(reqs[i].key);
              done.push_back({.token = &out[i]->token, .result = results[i]});
            }
          }
          for (const Status& s : claims.CompleteMany(done)) errors += s.ok() ? 0 : 1;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 0);
  for (int k = 0; k < kKeys; ++k) EXPECT_EQ(started[k].load(), 1) << "key b" << k;
  std::vector<ClaimRequest> all;
  for (int k = 0; k < kKeys; ++k) all.push_back(Req(Key(k)));
  auto replays = claims.ClaimMany(all);
  for (int k = 0; k < kKeys; ++k) {
    ASSERT_TRUE(replays[k].ok()) << replays[k].status();
    EXPECT_EQ(replays[k]->kind, Kind::kCompleted);
    EXPECT_EQ(replays[k]->result, "r-" + Key(k));
  }
}

TEST(RedisClaimStore, LostLeasesSayWhy) {
  auto store = OpenReal();
  ASSERT_NE(store, nullptr);
  auto c = store->TryClaim(Req("k"));
  ASSERT_TRUE(c.ok() && c->kind == Kind::kStarted);
  ASSERT_TRUE(store->Release(c->token).ok());
  for (int retry = 0; retry < 2; ++retry) {
    Status s = store->Complete(c->token, "r", false, 60'000);
    EXPECT_EQ(s.code(), Code::kLeaseLost) << s;
    EXPECT_NE(s.message().find("no claim on the key (released, expired or purged)"), std::string::npos) << s;
    EXPECT_EQ(store->Release(c->token).code(), Code::kLeaseLost);
    EXPECT_EQ(store->Extend(c->token, 1'000).status().code(), Code::kLeaseLost);
  }
  auto again = store->TryClaim(Req("k"));
  ASSERT_TRUE(again.ok() && again->kind == Kind::kStarted);
  ASSERT_TRUE(store->Complete(again->token, "r", false, 60'000).ok());
  Status released = store->Release(again->token);
  EXPECT_EQ(released.code(), Code::kLeaseLost);
  EXPECT_NE(released.message().find("completed already"), std::string::npos) << released;
}

// Scopes and keys are any bytes; the length prefix keeps "a:b"/"c" apart
// from "a"/"b:c".
TEST(RedisClaimStore, ScopesAndKeysAreBinarySafe) {
  auto store = OpenReal();
  ASSERT_NE(store, nullptr);
  const std::string odd_key("k\0\xff*?[", 6);
  ClaimRequest a = Req("c"), b = Req("b:c"), c = Req(odd_key);
  a.scope = "a:b";
  b.scope = "a";
  c.scope = "s*";
  for (int delivery = 0; delivery < 2; ++delivery) {
    for (const ClaimRequest* r : {&a, &b, &c}) {
      auto got = store->TryClaim(*r);
      ASSERT_OK(got);
      EXPECT_EQ(got->kind, delivery == 0 ? Kind::kStarted : Kind::kInProgress);
    }
  }
  auto listed = store->ListClaims("s*", 10);
  ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 1u) << "the scope's glob characters are escaped";
  EXPECT_EQ((*listed)[0].key, odd_key);
  auto all = store->ListClaims("", 100);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 3u);
  auto found = store->FindClaim("a:b", "c");
  ASSERT_TRUE(found.ok() && found->has_value());
  EXPECT_EQ((*found)->scope, "a:b");
  EXPECT_EQ((*found)->key, "c");
}

// The documented key layout, and TTLs that let abandoned and expired records
// vanish without a purge.
// New keys are claimed without a script, their tokens taken from a block
// each store instance reserves on the shared counter. A key claimed right
// after a release must still get a token above the released holder's, even
// from an instance whose block is older: the release leaves a tombstone that
// sends the next claim through the script's INCR. (Without it, `a` would
// hand out a token from its older block, below `b`'s.)
TEST(RedisClaimStore, AClaimAfterAReleaseOutranksTheReleasedHolderAcrossInstances) {
  const std::string prefix = UniquePrefix();
  auto a = OpenReal({.prefix = prefix});
  auto b = OpenReal({.prefix = prefix});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto first = a->TryClaim(Req("a-first"));  // a reserves its block first
  ASSERT_TRUE(first.ok() && first->kind == Kind::kStarted);
  for (int round = 0; round < 2; ++round) {
    auto held = b->TryClaim(Req("k"));
    ASSERT_TRUE(held.ok() && held->kind == Kind::kStarted) << round;
    EXPECT_GT(held->token.fence, first->token.fence);
    ASSERT_TRUE(b->Release(held->token).ok());
    auto next = a->TryClaim(Req("k"));
    ASSERT_TRUE(next.ok() && next->kind == Kind::kStarted) << round;
    EXPECT_GT(next->token.fence, held->token.fence) << "round " << round;
    EXPECT_FALSE(next->took_over);
    // The released holder stays refused; the new one completes.
    EXPECT_EQ(b->Complete(held->token, "late", false, 60'000).code(), Code::kLeaseLost);
    ASSERT_TRUE(a->Complete(next->token, "done", false, 60'000).ok());
    auto replay = b->TryClaim(Req("k"));
    ASSERT_TRUE(replay.ok() && replay->kind == Kind::kCompleted);
    EXPECT_EQ(replay->result, "done");
    ASSERT_EQ(RedisRaw({"DEL", prefix + "claim:7:charges:k"}), "1");
  }
}

// What a paused holder would still send: Complete, Release and Extend of
// its old token, each expected refused with kLeaseLost. A call the server
// did not get (kUnavailable: `store`'s connection died with a restarted
// server) is retried; it reconnects.
void ExpectRefused(ClaimStore& store, const ClaimToken& t) {
  auto refused = [&](auto call) {
    Code code = Code::kUnavailable;
    for (int attempt = 0; attempt < 5 && code == Code::kUnavailable; ++attempt) code = call();
    return code;
  };
  EXPECT_EQ(refused([&] { return store.Complete(t, "stale", false, 60'000).code(); }), Code::kLeaseLost) << t.key;
  EXPECT_EQ(refused([&] { return store.Release(t).code(); }), Code::kLeaseLost) << t.key;
  EXPECT_EQ(refused([&] { return store.Extend(t, 60'000).status().code(); }), Code::kLeaseLost) << t.key;
}

// Claims every request, each expected to start, and returns the tokens in
// order: the first `singles` one at a time on `one`, the rest in one batch
// on `many` (the two paths that draw fences differently).
std::vector<ClaimToken> StartAll(ClaimStore& one, ClaimStore& many, std::span<const ClaimRequest> reqs,
                                 size_t singles) {
  std::vector<ClaimToken> out;
  auto take = [&](Result<ClaimOutcome>& h, const ClaimRequest& r) {
    if (h.ok() && h->kind == Kind::kStarted) {
      out.push_back(h->token);
    } else {
      ADD_FAILURE() << r.key << " did not start: " << h.status();
    }
  };
  for (size_t i = 0; i < singles; ++i) {
    auto h = one.TryClaim(reqs[i]);
    take(h, reqs[i]);
  }
  auto rest = many.TryClaimMany(reqs.subspan(singles));
  for (size_t i = 0; i < rest.size(); ++i) take(rest[i], reqs[singles + i]);
  return out;
}

// The fencing counter and the records lost together (what a restart without
// persistence or a FLUSHDB does) while holder A, paused, keeps its token: a
// new holder B of the same key must get a higher token, A's late Complete,
// Release and Extend must be refused, and B's must go through. Before the
// counter was drawn above the server's clock, B's new instance reserved the
// block 1..1000 again and got A's very token, so A's Complete was accepted.
TEST(RedisClaimStore, ALostCounterStillOutranksAPausedHolder) {
  const std::string prefix = UniquePrefix();
  auto a = OpenReal({.prefix = prefix});
  ASSERT_NE(a, nullptr);
  const std::vector<ClaimRequest> reqs{Req("k"), Req("m1"), Req("m2")};
  const std::vector<ClaimToken> old = StartAll(*a, *a, reqs, 1);
  ASSERT_EQ(old.size(), reqs.size());
  // Lost behind A's back: the counter and the records.
  ASSERT_EQ(RedisRaw({"DEL", prefix + "fence", prefix + "claim:7:charges:k", prefix + "claim:7:charges:m1",
                      prefix + "claim:7:charges:m2"}),
            "4");
  auto b = OpenReal({.prefix = prefix});
  ASSERT_NE(b, nullptr);
  const std::vector<ClaimToken> now = StartAll(*b, *b, reqs, 1);
  ASSERT_EQ(now.size(), reqs.size());
  for (size_t i = 0; i < old.size(); ++i) EXPECT_GT(now[i].fence, old[i].fence) << old[i].key;
  for (const ClaimToken& t : old) ExpectRefused(*a, t);
  for (const ClaimToken& t : now) {
    ASSERT_OK(b->Extend(t, 60'000));
    ASSERT_TRUE(b->Complete(t, "b:" + t.key, false, 60'000).ok()) << t.key;
  }
  for (const ClaimToken& t : now) {
    auto replay = a->TryClaim(Req(t.key));
    ASSERT_TRUE(replay.ok() && replay->kind == Kind::kCompleted) << t.key;
    EXPECT_EQ(replay->result, "b:" + t.key);
  }
}

// A counter that went back while the records stayed (a replica promoted
// with the records but an older counter): a takeover, or a claim after a
// release, draws above the fence of the record it replaces, single or
// batched. The counter is pushed far ahead of the clock first, so that only
// the record's fence (not the clock) can put the new token above the old.
TEST(RedisClaimStore, ACounterThatWentBackStillOutranksTheRecordItReplaces) {
  const std::string prefix = UniquePrefix();
  FakeEnv clock;
  auto a = OpenReal({.prefix = prefix, .clock = &clock});
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(RedisRaw({"SET", prefix + "fence", "8000000000000000"}), "OK");  // ~2^53, past any clock
  // To take over (t) and released (r), each once singly and once in a batch.
  const std::vector<ClaimRequest> reqs{Req("t1", "b", 1'000), Req("r1", "b", 1'000), Req("t2", "b", 1'000),
                                       Req("r2", "b", 1'000)};
  const std::vector<ClaimToken> old = StartAll(*a, *a, reqs, 0);
  ASSERT_EQ(old.size(), reqs.size());
  ASSERT_TRUE(a->Release(old[1]).ok());
  ASSERT_TRUE(a->Release(old[3]).ok());
  ASSERT_EQ(RedisRaw({"SET", prefix + "fence", "5"}), "OK");  // went back
  clock.Advance(2'000);                                       // t1 and t2 are to take over
  auto b = OpenReal({.prefix = prefix, .clock = &clock});
  ASSERT_NE(b, nullptr);
  const std::vector<ClaimToken> now = StartAll(*b, *b, reqs, 2);
  ASSERT_EQ(now.size(), reqs.size());
  for (size_t i = 0; i < now.size(); ++i) {
    EXPECT_GT(now[i].fence, old[i].fence) << now[i].key;
    ExpectRefused(*a, old[i]);
    ASSERT_TRUE(b->Complete(now[i], "b", false, 60'000).ok()) << now[i].key;
  }
}

// A real restart without persistence mid-run: a redis-server of the test's
// own (no AOF, no snapshots) loses every claim and the counter to a SIGKILL.
// Claimed again after it comes back (by a new store instance, single and
// batched), every key gets a token above every token handed out before the
// restart, and the old holders (still running, their store reconnecting)
// are refused while the new ones complete.
TEST(RedisClaimStore, ARestartWithoutPersistenceHandsOutNoTokenAgain) {
  TempDir dir;
  const int port = FreeLocalPort();
  ASSERT_NE(port, 0) << "no free port on 127.0.0.1";
  OwnRedis server(port);
  ASSERT_TRUE(server.Start(dir.path(), /*persistent=*/false)) << "redis-server on 127.0.0.1:" << port;
  const std::string prefix = UniquePrefix();
  auto a = OpenReal({.url = server.url(), .prefix = prefix});
  auto a2 = OpenReal({.url = server.url(), .prefix = prefix});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(a2, nullptr);
  std::vector<ClaimRequest> reqs;
  for (int i = 0; i < 6; ++i) reqs.push_back(Req("k" + std::to_string(i)));
  // Single claims from one instance, a batch from the other.
  const std::vector<ClaimToken> old = StartAll(*a, *a2, reqs, 2);
  ASSERT_EQ(old.size(), reqs.size());
  int64_t highest_old = 0;
  for (const ClaimToken& t : old) highest_old = std::max(highest_old, t.fence);

  server.Kill();
  ASSERT_TRUE(server.Start(dir.path(), /*persistent=*/false));
  ASSERT_EQ(RedisRaw({"DBSIZE"}, server.url()), "0") << "the restart kept data";

  auto b = OpenReal({.url = server.url(), .prefix = prefix});
  ASSERT_NE(b, nullptr);
  const std::vector<ClaimToken> now = StartAll(*b, *b, reqs, 3);
  ASSERT_EQ(now.size(), reqs.size());
  for (const ClaimToken& t : now) EXPECT_GT(t.fence, highest_old) << t.key;
  for (size_t i = 0; i < old.size(); ++i) ExpectRefused(i < 2 ? *a : *a2, old[i]);
  std::vector<Completion> done;
  for (const ClaimToken& t : now) done.push_back({.token = &t, .result = "new"});
  for (const Status& s : b->CompleteMany(done, 60'000)) EXPECT_TRUE(s.ok()) << s;
  for (const ClaimRequest& r : reqs) {
    auto replay = a->TryClaim(r);
    ASSERT_TRUE(replay.ok() && replay->kind == Kind::kCompleted) << r.key;
    EXPECT_EQ(replay->result, "new");
  }
  a.reset();
  a2.reset();
  b.reset();
  server.Stop();
}

TEST(RedisClaimStore, RecordsCarryTheirTtl) {
  const std::string prefix = UniquePrefix();
  auto store = OpenReal({.prefix = prefix, .abandon_margin_ms = 60'000});
  ASSERT_NE(store, nullptr);
  const std::string key = prefix + "claim:7:charges:k";
  auto c = store->TryClaim(Req("k", "b", 1'000));
  ASSERT_TRUE(c.ok() && c->kind == Kind::kStarted);
  EXPECT_EQ(RedisRaw({"TYPE", key}), "string") << "one string per record: one GET reads it";
  int64_t ttl = std::atoll(RedisRaw({"PTTL", key}).c_str());
  EXPECT_GT(ttl, 0);
  EXPECT_LE(ttl, 61'000);
  ASSERT_TRUE(store->Complete(c->token, "r", false, 3'600'000).ok());
  ttl = std::atoll(RedisRaw({"PTTL", key}).c_str());
  EXPECT_GT(ttl, 61'000);
  EXPECT_LE(ttl, 3'600'000);
  // New keys take their tokens from a block reserved on the counter.
  EXPECT_GE(std::atoll(RedisRaw({"GET", prefix + "fence"}).c_str()), c->token.fence);
}

// A Complete made by another process wakes a watch (PUBLISH from the
// script; not the in-process board, which a fork does not share). Ends only
// when woken: a broken wake-up fails by the test's timeout.
TEST(RedisClaimStore, WatchIsWokenByAnotherProcess) {
  const std::string prefix = UniquePrefix();
  auto store = OpenReal({.prefix = prefix});
  ASSERT_NE(store, nullptr);
  auto c = store->TryClaim(Req("slow"));
  ASSERT_TRUE(c.ok() && c->kind == Kind::kStarted);
  std::unique_ptr<ClaimStore::Watch> watch = store->WatchKey("charges", "slow");
  const ClaimToken token = c->token;
  pid_t child = ::fork();
  if (child == 0) {
    auto other = redis::ClaimStore::Open({.url = RedisUrl(), .prefix = prefix});
    bool ok = other.ok() && (*other)->Complete(token, "from the child", false, 60'000).ok() &&
              (*other)->Complete(token, "from the child", false, 60'000).ok();  // retried: still OK
    ::_exit(ok ? 0 : 1);
  }
  ASSERT_GT(child, 0);
  watch->Wait(3'600'000);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (int delivery = 0; delivery < 2; ++delivery) {
    auto replay = store->TryClaim(Req("slow"));
    ASSERT_TRUE(replay.ok());
    EXPECT_EQ(replay->kind, Kind::kCompleted);
    EXPECT_EQ(replay->result, "from the child");
  }
}

// A connection the server closed fails one call (kUnavailable), is dropped,
// and the next call reconnects.
TEST(RedisClaimStore, BrokenConnectionIsDroppedAndReplaced) {
  const std::string name = "idem-test-kill-" + std::to_string(::getpid());
  auto store = OpenReal({.pool_size = 1, .client_name = name});
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->NowMs().ok());
  ASSERT_GE(KillClientsNamed(name), 1);
  auto failed = store->TryClaim(Req("after-kill"));
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), Code::kUnavailable) << failed.status();
  EXPECT_NE(failed.status().message().find(RedisAddress()), std::string::npos) << failed.status();
  for (int delivery = 0; delivery < 2; ++delivery) {
    auto c = store->TryClaim(Req("after-kill"));
    ASSERT_OK(c);
    EXPECT_EQ(c->kind, delivery == 0 ? Kind::kStarted : Kind::kInProgress);
  }
}

// The scripts are loaded again after the server forgot them.
TEST(RedisClaimStore, ScriptFlushIsSurvived) {
  auto store = OpenReal({.pool_size = 1});
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->TryClaim(Req("before")).ok());
  ASSERT_EQ(RedisRaw({"SCRIPT", "FLUSH"}), "OK");
  for (int delivery = 0; delivery < 2; ++delivery) {
    auto c = store->TryClaim(Req("after"));
    ASSERT_OK(c);
    EXPECT_EQ(c->kind, delivery == 0 ? Kind::kStarted : Kind::kInProgress);
  }
  // A batch of completions after a flush: each is loaded again and runs.
  std::vector<Result<ClaimOutcome>> held =
      store->TryClaimMany(std::vector<ClaimRequest>{Req("f1"), Req("f2"), Req("f3")});
  std::vector<Completion> done;
  for (auto& h : held) {
    ASSERT_TRUE(h.ok() && h->kind == Kind::kStarted) << h.status();
    done.push_back({.token = &h->token, .result = "r"});
  }
  ASSERT_EQ(RedisRaw({"SCRIPT", "FLUSH"}), "OK");
  for (const Status& s : store->CompleteMany(done, 60'000)) EXPECT_TRUE(s.ok()) << s;
  for (int delivery = 0; delivery < 2; ++delivery)
    for (auto& r : store->TryClaimMany(std::vector<ClaimRequest>{Req("f1"), Req("f2"), Req("f3")})) {
      ASSERT_OK(r);
      EXPECT_EQ(r->kind, Kind::kCompleted);
    }
}

// A key under the prefix that idem did not write is reported, not trusted.
TEST(RedisClaimStore, ForeignRecordIsCorruption) {
  const std::string prefix = UniquePrefix();
  auto store = OpenReal({.prefix = prefix});
  ASSERT_NE(store, nullptr);
  ASSERT_EQ(RedisRaw({"SET", prefix + "claim:7:charges:str", "x"}), "OK");
  ASSERT_EQ(RedisRaw({"HSET", prefix + "claim:7:charges:hash", "st", "p", "fp", "short"}), "2");
  for (int delivery = 0; delivery < 2; ++delivery) {
    EXPECT_EQ(store->TryClaim(Req("str")).status().code(), Code::kCorruption);
    EXPECT_EQ(store->FindClaim("charges", "hash").status().code(), Code::kCorruption);
    // In a batch only the foreign record's answer is an error.
    auto batch = store->TryClaimMany(std::vector<ClaimRequest>{Req("fine"), Req("str")});
    ASSERT_TRUE(batch[0].ok()) << batch[0].status();
    EXPECT_EQ(batch[0]->kind, delivery == 0 ? Kind::kStarted : Kind::kInProgress);
    EXPECT_EQ(batch[1].status().code(), Code::kCorruption);
  }
}

}  // namespace
}  // namespace idem::testing
