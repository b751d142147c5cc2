// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem bench claims: the two-phase mode on the workload of the Powertools
// peer (../shared/peers/powertools-idempotency, EFFECT=counter): N unique
// keys, each called DUP times in passes (all keys, then all again),
// CONCURRENCY calls in flight: one thread each, or with --batch B,
// CONCURRENCY/B threads each claiming B keys at once (Claims::ClaimMany)
// and completing them at once (CompleteMany). A call claims its key
// (Claims::Claim); the first runs the work (a counter) and completes the key
// with its result; every later call gets the stored result (a replay), which
// is checked against the first. Pass 1 measures claims (claim + complete),
// the later passes replays; the result line is the peers' own, plus both
// rates.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <iostream>
#include <mutex>
#include <thread>
#include <vector>

#include "commands.h"
#include "idem/claims.h"

namespace idem::cli {

namespace {

std::string KeyOf(int64_t i) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "00000000-0000-4000-8000-%012llx", static_cast<unsigned long long>(i));
  return buf;
}

struct PassResult {
  double seconds = 0;
  int64_t started = 0, replayed = 0, in_progress_retries = 0, mismatches = 0;
  Status error;
};

// The peers' workload on Claims: `n` keys, each called by one thread at a
// time, `batch` calls in flight per thread; the work is a counter, whose
// value is each key's result (kept in `first` to check the replays).
class Passes {
 public:
  Passes(Claims& claims, std::string scope, int64_t n, int64_t batch, int64_t threads)
      : claims_(claims),
        scope_(std::move(scope)),
        n_(n),
        batch_(batch),
        threads_(threads),
        first_(static_cast<size_t>(n)) {}

  // One pass over every key, from `threads` threads.
  PassResult Run() {
    PassResult pr;
    next_ = 0;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int64_t t = 0; t < threads_; ++t) threads.emplace_back([&] { Worker(pr); });
    for (auto& t : threads) t.join();
    pr.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return pr;
  }
  int64_t calls() const { return counter_.load(); }

 private:
  ClaimRequest Request(int64_t i) const {
    const std::string key = KeyOf(i);
    const std::string body = "{\"messageId\":\"" + key + "\",\"amountCents\":" + std::to_string(i % 1000 + 1) + "}";
    return ClaimRequest{.scope = scope_, .key = key, .fingerprint = FingerprintOf(body), .lease_ms = 60'000};
  }
  std::string Work() { return "p-" + std::to_string(counter_.fetch_add(1) + 1); }

  // One call's answer (after its claim): the check.
  void Settle(int64_t i, const ClaimOutcome& c, PassResult& mine) {
    if (c.kind == ClaimOutcome::Kind::kCompleted) {
      if (c.result != first_[static_cast<size_t>(i)]) ++mine.mismatches;
      ++mine.replayed;
    } else if (c.kind == ClaimOutcome::Kind::kConflict) {
      mine.error = Status::Conflict("key " + KeyOf(i) + " answered conflict");
    }
  }

  // One call at a time: Claim, the work, Complete.
  void One(int64_t i, PassResult& mine) {
    ClaimRequest req = Request(i);
    for (;;) {
      auto c = claims_.Claim(req);
      if (!c.ok()) {
        mine.error = c.status();
        return;
      }
      if (c->kind == ClaimOutcome::Kind::kInProgress) {  // as the peer: back off 5 ms and call again
        ++mine.in_progress_retries;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      if (c->kind == ClaimOutcome::Kind::kStarted) {
        std::string result = Work();
        if (Status s = claims_.Complete(c->token, result); !s.ok()) {
          mine.error = s;
          return;
        }
        first_[static_cast<size_t>(i)] = result;
        ++mine.started;
      }
      return Settle(i, *c, mine);
    }
  }

  // Calls [i0, end) in flight from this thread: claimed together, the work,
  // completed together; a key in progress is called again on its own.
  void Many(int64_t i0, int64_t end, PassResult& mine) {
    std::vector<ClaimRequest> reqs;
    for (int64_t i = i0; i < end; ++i) reqs.push_back(Request(i));
    auto outcomes = claims_.ClaimMany(reqs);
    std::vector<Completion> done;
    std::vector<int64_t> done_i;
    std::deque<std::string> results;
    for (int64_t i = i0; i < end; ++i) {
      auto& c = outcomes[static_cast<size_t>(i - i0)];
      if (!c.ok()) {
        mine.error = c.status();
        break;
      }
      if (c->kind == ClaimOutcome::Kind::kInProgress) {
        ++mine.in_progress_retries;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        One(i, mine);
      } else if (c->kind == ClaimOutcome::Kind::kStarted) {
        results.push_back(Work());
        done.push_back({.token = &c->token, .result = results.back()});
        done_i.push_back(i);
      } else {
        Settle(i, *c, mine);
      }
    }
    auto statuses = claims_.CompleteMany(done);
    for (size_t k = 0; k < done.size(); ++k) {
      if (!statuses[k].ok()) {
        mine.error = statuses[k];
        break;
      }
      first_[static_cast<size_t>(done_i[k])] = std::string(done[k].result);
      ++mine.started;
    }
  }

  void Worker(PassResult& pr) {
    PassResult mine;
    for (int64_t i0; mine.error.ok() && (i0 = next_.fetch_add(batch_)) < n_;) {
      if (batch_ == 1) {
        One(i0, mine);
      } else {
        Many(i0, std::min<int64_t>(n_, i0 + batch_), mine);
      }
    }
    std::lock_guard lock(mu_);
    pr.started += mine.started;
    pr.replayed += mine.replayed;
    pr.in_progress_retries += mine.in_progress_retries;
    pr.mismatches += mine.mismatches;
    if (!mine.error.ok()) pr.error = mine.error;
  }

  Claims& claims_;
  const std::string scope_;
  const int64_t n_, batch_, threads_;
  std::vector<std::string> first_;
  std::atomic<int64_t> counter_{0}, next_{0};
  std::mutex mu_;
};

}  // namespace

int RunBenchClaims(const Args& args) {
  const std::string cmd = "bench claims";
  if (args.Bool("json"))  // its output is the peers' result line, for their scripts
    return Fail(cmd, Status::InvalidArgument("--json: bench claims prints the peers' result line, not JSON"));
  auto n = args.Has("n") ? args.GetInt("n") : Result<int64_t>(20000);
  auto dup = args.Has("dup") ? args.GetInt("dup") : Result<int64_t>(2);
  auto conc = args.Has("concurrency") ? args.GetInt("concurrency") : Result<int64_t>(16);
  auto batch = args.Has("batch") ? args.GetInt("batch") : Result<int64_t>(1);
  for (const auto* r : {&n, &dup, &conc, &batch})
    if (!r->ok()) return Fail(cmd, r->status());
  if (*n < 1 || *dup < 1 || *conc < 1 || *conc > 256)
    return Fail(cmd, Status::InvalidArgument("need --n >= 1, --dup >= 1, 1 <= --concurrency <= 256"));
  if (*batch < 1 || *conc % *batch != 0)
    return Fail(cmd, Status::InvalidArgument("--batch must be >= 1 and divide --concurrency (" + std::to_string(*conc) +
                                             "), got " + std::to_string(*batch)));
  auto opened = OpenClaimStore(args.Get("store"));
  if (!opened.ok()) return Fail(cmd, opened.status());
  ClaimStore& store = *opened->claims;
  auto claims_owned = Claims::Open(store, Claims::Options{.retention_ms = 3'600'000});
  if (!claims_owned.ok()) return Fail(cmd, claims_owned.status());
  // A scope of its own per run: earlier runs' records never answer for this one.
  Passes passes(**claims_owned, "bench-" + std::to_string(Env::Default()->NowMs()), *n, *batch, *conc / *batch);

  PassResult claims_pass = passes.Run();
  if (!claims_pass.error.ok()) return Fail(cmd, claims_pass.error);
  PassResult replays;
  for (int64_t d = 1; d < *dup; ++d) {
    PassResult p = passes.Run();
    if (!p.error.ok()) return Fail(cmd, p.error);
    replays.seconds += p.seconds;
    replays.replayed += p.replayed;
    replays.mismatches += p.mismatches;
    replays.in_progress_retries += p.in_progress_retries;
  }
  const int64_t deliveries = *n * *dup;
  const double seconds = claims_pass.seconds + replays.seconds;
  const bool ok = passes.calls() == *n && claims_pass.started == *n && replays.replayed == *n * (*dup - 1) &&
                  replays.mismatches == 0 && claims_pass.mismatches == 0;
  std::printf(
      "info: effect=counter concurrency=%lld batch=%lld function_calls=%lld replay_mismatches=%lld "
      "in_progress_retries=%lld claims_per_s=%.1f replays_per_s=%.1f durability=\"%s\" ok=%s\n",
      static_cast<long long>(*conc), static_cast<long long>(*batch), static_cast<long long>(passes.calls()),
      static_cast<long long>(replays.mismatches) + static_cast<long long>(claims_pass.mismatches),
      static_cast<long long>(claims_pass.in_progress_retries + replays.in_progress_retries), *n / claims_pass.seconds,
      replays.seconds > 0 ? replays.replayed / replays.seconds : 0.0, opened->durability.c_str(),
      ok ? "true" : "false");
  return PeerResult("idem-claims-" + opened->kind + (*batch > 1 ? "-batch" + std::to_string(*batch) : ""), opened->kind,
                    *n, deliveries, seconds, passes.calls(), ok);
}

}  // namespace idem::cli
