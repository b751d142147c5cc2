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
  const int64_t threads_n = *conc / *batch;

  auto opened = OpenClaimStore(args.Get("store"));
  if (!opened.ok()) return Fail(cmd, opened.status());
  ClaimStore& store = *opened->claims;
  // A scope of its own per run: earlier runs' records never answer for this one.
  const std::string scope = "bench-" + std::to_string(Env::Default()->NowMs());
  auto claims_owned = Claims::Open(store, Claims::Options{.retention_ms = 3'600'000});
  if (!claims_owned.ok()) return Fail(cmd, claims_owned.status());
  Claims& claims = **claims_owned;

  std::vector<std::string> first(static_cast<size_t>(*n));
  std::atomic<int64_t> counter{0};
  auto run_pass = [&](bool first_pass) {
    PassResult pr;
    std::mutex mu;
    std::atomic<int64_t> next{0};
    // One call's answer (after its claim): the work and the check.
    auto settle = [&](int64_t i, const ClaimOutcome& c, PassResult& mine) {
      if (c.kind == ClaimOutcome::Kind::kCompleted) {
        if (c.result != first[static_cast<size_t>(i)]) ++mine.mismatches;
        ++mine.replayed;
      } else if (c.kind == ClaimOutcome::Kind::kConflict) {
        mine.error = Status::Conflict("key " + KeyOf(i) + " answered conflict");
      }
    };
    auto request = [&](int64_t i) {
      const std::string key = KeyOf(i);
      const std::string body = "{\"messageId\":\"" + key + "\",\"amountCents\":" + std::to_string(i % 1000 + 1) + "}";
      return ClaimRequest{.scope = scope, .key = key, .fingerprint = FingerprintOf(body), .lease_ms = 60'000};
    };
    // One call at a time: Claim, the work, Complete.
    auto one = [&](int64_t i, PassResult& mine) {
      ClaimRequest req = request(i);
      for (;;) {
        auto c = claims.Claim(req);
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
          std::string result = "p-" + std::to_string(counter.fetch_add(1) + 1);  // the work
          if (Status s = claims.Complete(c->token, result); !s.ok()) {
            mine.error = s;
            return;
          }
          first[static_cast<size_t>(i)] = result;
          ++mine.started;
        }
        return settle(i, *c, mine);
      }
    };
    auto worker = [&] {
      PassResult mine;
      for (int64_t i0; mine.error.ok() && (i0 = next.fetch_add(*batch)) < *n;) {
        const int64_t end = std::min<int64_t>(*n, i0 + *batch);
        if (*batch == 1) {
          one(i0, mine);
          continue;
        }
        // B calls in flight from this thread: claimed together, the work,
        // completed together; a key in progress is called again on its own.
        std::vector<ClaimRequest> reqs;
        for (int64_t i = i0; i < end; ++i) reqs.push_back(request(i));
        auto outcomes = claims.ClaimMany(reqs);
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
            one(i, mine);
          } else if (c->kind == ClaimOutcome::Kind::kStarted) {
            results.push_back("p-" + std::to_string(counter.fetch_add(1) + 1));  // the work
            done.push_back({.token = &c->token, .result = results.back()});
            done_i.push_back(i);
          } else {
            settle(i, *c, mine);
          }
        }
        auto statuses = claims.CompleteMany(done);
        for (size_t k = 0; k < done.size(); ++k) {
          if (!statuses[k].ok()) {
            mine.error = statuses[k];
            break;
          }
          first[static_cast<size_t>(done_i[k])] = std::string(done[k].result);
          ++mine.started;
        }
      }
      std::lock_guard lock(mu);
      pr.started += mine.started;
      pr.replayed += mine.replayed;
      pr.in_progress_retries += mine.in_progress_retries;
      pr.mismatches += mine.mismatches;
      if (!mine.error.ok()) pr.error = mine.error;
    };
    (void)first_pass;
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int64_t t = 0; t < threads_n; ++t) threads.emplace_back(worker);
    for (auto& t : threads) t.join();
    pr.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return pr;
  };

  PassResult claims_pass = run_pass(true);
  if (!claims_pass.error.ok()) return Fail(cmd, claims_pass.error);
  PassResult replays;
  for (int64_t d = 1; d < *dup; ++d) {
    PassResult p = run_pass(false);
    if (!p.error.ok()) return Fail(cmd, p.error);
    replays.seconds += p.seconds;
    replays.replayed += p.replayed;
    replays.mismatches += p.mismatches;
    replays.in_progress_retries += p.in_progress_retries;
  }
  const int64_t deliveries = *n * *dup;
  const double seconds = claims_pass.seconds + replays.seconds;
  const bool ok = counter.load() == *n && claims_pass.started == *n && replays.replayed == *n * (*dup - 1) &&
                  replays.mismatches == 0 && claims_pass.mismatches == 0;
  std::printf(
      "info: effect=counter concurrency=%lld batch=%lld function_calls=%lld replay_mismatches=%lld "
      "in_progress_retries=%lld claims_per_s=%.1f replays_per_s=%.1f durability=\"%s\" ok=%s\n",
      static_cast<long long>(*conc), static_cast<long long>(*batch), static_cast<long long>(counter.load()),
      static_cast<long long>(replays.mismatches) + static_cast<long long>(claims_pass.mismatches),
      static_cast<long long>(claims_pass.in_progress_retries + replays.in_progress_retries), *n / claims_pass.seconds,
      replays.seconds > 0 ? replays.replayed / replays.seconds : 0.0, opened->durability.c_str(),
      ok ? "true" : "false");
  return PeerResult("idem-claims-" + opened->kind + (*batch > 1 ? "-batch" + std::to_string(*batch) : ""), opened->kind,
                    *n, deliveries, seconds, counter.load(), ok);
}

}  // namespace idem::cli
