// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem bench pooler: PostgreSQL through a transaction pooler (pgbouncer
// pool_mode=transaction) beside the same server reached directly, in one
// run. Rounds alternate the sides (and which goes first), so both see the
// same machine noise; the figure of record is each workload's median of the
// per-round ratios pooled/direct:
//   inbox  Inbox::Handle per message (its marker and a bench_payments row in
//          one transaction, fresh ids), --consumers threads at once, each
//          with its own connection, for --seconds per side and round;
//   http   first executions of POST /charges on `idem provider`'s server
//          (ProviderServer, --one-transaction) in this process, with group
//          commit (--group-commit G, --committers C, --fibers F): --requests
//          fresh keys per side and round from --connections keep-alive
//          connections.
// Each side opens its own stores and provider from its URL; the pooled side
// finds the pooler by itself (?idem_pooler=auto) unless its URL says.
// --unnamed adds a third side, the direct URL with ?idem_pooler=transaction:
// the pooled side's statements (unnamed, parsed at every execution) without
// the pooler in between, which splits what the pooler costs into the
// server's work and the pooler's hop. A warm-up round of each side comes
// first (connections opened, statements prepared), unmeasured. Checks every
// request answered 201 and one charge per key; exit 1 if not.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "components.h"
#include "http_load.h"
#include "idem/inbox.h"
#include "idem/url.h"
#include "marker_workload.h"
#include "provider_server.h"

namespace idem::cli {
namespace {

constexpr const char* kApiKey = "sk_pooler_ab";
constexpr const char* kPrincipal = "acct_pooler_ab";
constexpr double kTarget = 0.8;  // issue 34: through the pooler at least 0.8x direct
constexpr int64_t kWarmupRequests = 1'000;
constexpr double kWarmupSeconds = 1.0;

struct SideSpec {
  std::string name, url;
};

// What each side opened: its stores, inbox and provider.
struct Opened {
  std::unique_ptr<Store> store;  // the inbox's
  std::unique_ptr<Inbox> inbox;
  std::unique_ptr<ProviderServer> provider;
  uint64_t group_commits = 0, grouped = 0;  // over the measured rounds
};

// One workload's figures: each side's rate per measured round.
struct Workload {
  std::string name;
  std::map<std::string, std::vector<double>> per_s;
  nlohmann::json rounds = nlohmann::json::array();
};

double Ratio(const std::vector<double>& num, const std::vector<double>& den, size_t i) {
  return den[i] > 0 ? num[i] / den[i] : 0;
}

std::vector<double> Ratios(const Workload& w, const std::string& side) {
  std::vector<double> out;
  const auto& num = w.per_s.at(side);
  const auto& den = w.per_s.at("direct");
  for (size_t i = 0; i < den.size(); ++i) out.push_back(Ratio(num, den, i));
  return out;
}

// The direct URL with unnamed statements (the pooler's way) asked for.
Result<std::string> Unnamed(const std::string& url) {
  if (url.find("idem_pooler=") != std::string::npos)
    return Status::InvalidArgument("--unnamed: --direct already sets idem_pooler; give it without");
  return url + (url.find('?') == std::string::npos ? "?" : "&") + "idem_pooler=transaction";
}

std::vector<HttpPost> Charges(const std::string& prefix, int64_t n) {
  std::vector<HttpPost> posts(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    HttpPost& p = posts[static_cast<size_t>(i)];
    p.body = R"({"amount":)" + std::to_string(1 + i % 1000) + R"(,"currency":"usd","customer":"cus_bench"})";
    p.headers = {{"Authorization", std::string("Bearer ") + kApiKey}, {"Idempotency-Key", prefix + std::to_string(i)}};
  }
  return posts;
}

// How many prepared statements the session a transaction of `store` lands
// on holds: none through a transaction pooler (every statement unnamed).
Result<int64_t> PreparedInSession(Store& store) {
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  IDEM_ASSIGN_OR_RETURN(Rows r, tx->Query("SELECT count(*) FROM pg_prepared_statements"));
  IDEM_RETURN_IF_ERROR(tx->Commit());
  return r.rows[0][0].AsInt();
}

// Charges made for keys starting with `prefix`, and whether any key has two.
Result<std::pair<int64_t, bool>> ChargesFor(Store& store, const std::string& prefix) {
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  IDEM_ASSIGN_OR_RETURN(Rows r, tx->Query("SELECT count(*), count(DISTINCT idem_key) FROM provider_charges "
                                          "WHERE principal = $1 AND substr(idem_key, 1, length($2)) = $2",
                                          {kPrincipal, prefix}));
  IDEM_RETURN_IF_ERROR(tx->Commit());
  return std::make_pair(r.rows[0][0].AsInt(), r.rows[0][0].AsInt() != r.rows[0][1].AsInt());
}

}  // namespace

int RunBenchPooler(const Args& args) {
  const std::string cmd = "bench pooler";
  if (!args.Has("direct") || !args.Has("pooled"))
    return Fail(cmd, Status::InvalidArgument(
                         "--direct URL (the server) and --pooled URL (the same server through the pooler) are both "
                         "required"));
  const std::string direct = args.Get("direct"), pooled = args.Get("pooled");
  for (const std::string* u : {&direct, &pooled})
    if (!IsPostgresScheme(*u))
      return Fail(cmd, Status::InvalidArgument("--direct and --pooled must be postgres:// URLs, not " + RedactUrl(*u)));
  auto consumers = args.Has("consumers") ? args.GetInt("consumers", 1, 64) : Result<int64_t>(4);
  auto seconds = args.GetDouble("seconds", 0.01, 3600);
  auto rounds = args.Has("rounds") ? args.GetInt("rounds", 1, 1000) : Result<int64_t>(5);
  auto requests = args.Has("requests") ? args.GetInt("requests", 1, 10'000'000) : Result<int64_t>(20'000);
  auto connections = args.Has("connections") ? args.GetInt("connections", 1, 256) : Result<int64_t>(16);
  auto group = args.Has("group-commit") ? args.GetInt("group-commit", 0, 10'000) : Result<int64_t>(64);
  auto committers = args.Has("committers") ? args.GetInt("committers", 1, 64) : Result<int64_t>(1);
  auto fibers = args.Has("fibers") ? args.GetInt("fibers", 0, 64) : Result<int64_t>(1);
  for (const auto* r : {&consumers, &rounds, &requests, &connections, &group, &committers, &fibers})
    if (!r->ok()) return Fail(cmd, r->status());
  if (!seconds.ok()) return Fail(cmd, seconds.status());
  if (*fibers > 0 && *group <= 1)
    return Fail(cmd, Status::InvalidArgument("--fibers needs --group-commit above 1 (give --fibers 0 without)"));
  bench::IdKind kind = bench::IdKind::kRandom;
  if (const std::string ids = args.Get("ids"); ids == "ordered") {
    kind = bench::IdKind::kOrdered;
  } else if (ids != "random") {
    return Fail(cmd, Status::InvalidArgument("--ids must be random or ordered, not '" + ids + "'"));
  }
  const std::string which = args.Has("workloads") ? args.Get("workloads") : "inbox,http";
  const bool run_inbox = which == "inbox" || which == "inbox,http" || which == "http,inbox";
  const bool run_http = which == "http" || which == "inbox,http" || which == "http,inbox";
  if (!run_inbox && !run_http)
    return Fail(cmd, Status::InvalidArgument("--workloads must be inbox, http or inbox,http, not '" + which + "'"));
  std::vector<SideSpec> sides = {{"direct", direct}, {"pooled", pooled}};
  if (args.Bool("unnamed")) {
    auto u = Unnamed(direct);
    if (!u.ok()) return Fail(cmd, u.status());
    sides.push_back({"unnamed", *u});
  }
  const bool json = args.Bool("json");

  // --- each side's store, inbox and provider
  std::map<std::string, Opened> opened;
  for (const SideSpec& side : sides) {
    Opened& o = opened[side.name];
    auto store = OpenStore(side.url, true, static_cast<int>(*consumers) + 1);
    if (!store.ok()) return Fail(cmd, store.status().WithContext(side.name));
    o.store = std::move(*store);
    if (side.name == "direct") {
      if (Status s = bench::PrepareBusinessTable(*o.store); !s.ok()) return Fail(cmd, s.WithContext("business table"));
    }
    auto inbox = Inbox::Open(*o.store, {.consumer = "pooler-ab-" + side.name});
    if (!inbox.ok()) return Fail(cmd, inbox.status());
    o.inbox = std::move(*inbox);
    if (!run_http) continue;
    ProviderServerOptions p;
    p.store_url = side.url;
    p.api_keys = {{kApiKey, kPrincipal}};
    p.one_transaction = true;
    p.idempotency.group_commit_max = static_cast<int>(*group);
    p.idempotency.group_committers = static_cast<int>(*committers);
    p.idempotency.max_keys_per_principal = int64_t{1} << 40;  // every round's keys stay stored
    p.fibers = static_cast<int>(*fibers);
    auto provider = ProviderServer::Start(std::move(p));
    if (!provider.ok()) return Fail(cmd, provider.status().WithContext(side.name + " provider"));
    o.provider = std::move(*provider);
  }

  if (!json) {
    std::printf("bench pooler: direct %s, pooled %s%s\n", RedactUrl(direct).c_str(), RedactUrl(pooled).c_str(),
                sides.size() > 2 ? ", unnamed: direct with ?idem_pooler=transaction" : "");
    if (run_inbox)
      std::printf("  inbox: Inbox::Handle per message, %lld consumers, %s ids, %.2f s per side and round\n",
                  static_cast<long long>(*consumers), std::string(bench::IdKindName(kind)).c_str(), *seconds);
    if (run_http)
      std::printf(
          "  http: POST /charges first executions, one transaction, group commit %lld, %lld committer(s), %lld "
          "fiber thread(s), %lld connections, %lld keys per side and round\n",
          static_cast<long long>(*group), static_cast<long long>(*committers), static_cast<long long>(*fibers),
          static_cast<long long>(*connections), static_cast<long long>(*requests));
    std::printf("  %lld rounds after a warm-up; sides alternate which goes first\n", static_cast<long long>(*rounds));
    std::fflush(stdout);
  }

  const std::string run = "pab" + std::to_string(Env::Default()->NowMs()) + "-";
  std::vector<Workload> workloads;
  if (run_inbox) workloads.push_back({"inbox"});
  if (run_http) workloads.push_back({"http"});
  std::map<std::string, int64_t> keys_sent;
  for (int64_t round = 0; round <= *rounds; ++round) {  // round 0 warms up
    const bool warm = round == 0;
    for (Workload& w : workloads) {
      nlohmann::json line = {{"round", round}};
      for (size_t k = 0; k < sides.size(); ++k) {
        const SideSpec& side = sides[(static_cast<size_t>(round) + k) % sides.size()];
        Opened& o = opened[side.name];
        double rate = 0;
        if (w.name == "inbox") {
          bench::Side s;
          Inbox& inbox = *o.inbox;
          Status st = bench::ParallelRound(kind, static_cast<int>(*consumers), 1,
                                           warm ? std::min(kWarmupSeconds, *seconds) : *seconds, &s,
                                           [&](std::span<const Message> b) { return bench::GuardedBatch(inbox, b); });
          if (!st.ok()) return Fail(cmd, st.WithContext("inbox, " + side.name));
          rate = s.rounds.back();
        } else {
          const int64_t n = warm ? std::min(kWarmupRequests, *requests) : *requests;
          const auto posts = Charges(run + side.name + "-" + std::to_string(round) + "-", n);
          const http::Idempotency::Counters before = o.provider->counters();
          const PostedAll r = PostAll(o.provider->port(), "/charges", posts, static_cast<int>(*connections), 201, cmd);
          const http::Idempotency::Counters after = o.provider->counters();
          keys_sent[side.name] += n;
          if (r.unexpected > 0) {
            std::fprintf(stderr, "CORRECTNESS CHECK FAILED: http, %s, round %lld: %lld of %lld answers not 201\n",
                         side.name.c_str(), static_cast<long long>(round), static_cast<long long>(r.unexpected),
                         static_cast<long long>(n));
            return kExitCheckFailed;
          }
          rate = static_cast<double>(n) / r.seconds;
          if (!warm) {
            o.group_commits += after.group_commits - before.group_commits;
            o.grouped += after.grouped_requests - before.grouped_requests;
          }
        }
        if (!warm) w.per_s[side.name].push_back(rate);
        line[side.name + "_per_s"] = rate;
      }
      if (warm) continue;
      const size_t i = w.per_s["direct"].size() - 1;
      std::string text;
      for (const SideSpec& side : sides) {
        char buf[96];
        std::snprintf(buf, sizeof buf, ", %s %.0f/s", side.name.c_str(), w.per_s[side.name][i]);
        text += buf;
        if (side.name == "direct") continue;
        const double ratio = Ratio(w.per_s[side.name], w.per_s["direct"], i);
        line[side.name + "_over_direct"] = ratio;
        std::snprintf(buf, sizeof buf, " (%s/direct %.3f)", side.name.c_str(), ratio);
        text += buf;
      }
      w.rounds.push_back(line);
      if (!json) std::printf("round %lld %s%s\n", static_cast<long long>(round), w.name.c_str(), text.c_str());
      std::fflush(stdout);
    }
  }

  // --- checks: one charge per key, every key charged; what the sessions hold
  int rc = kExitOk;
  nlohmann::json prepared = nlohmann::json::object(), groups = nlohmann::json::object();
  for (const SideSpec& side : sides) {
    Opened& o = opened[side.name];
    auto n = PreparedInSession(*o.store);
    if (!n.ok()) return Fail(cmd, n.status().WithContext(side.name));
    prepared[side.name] = *n;
    if (!run_http) continue;
    auto charges = ChargesFor(*opened["direct"].store, run + side.name + "-");
    if (!charges.ok()) return Fail(cmd, charges.status());
    if (charges->first != keys_sent[side.name] || charges->second) {
      std::fprintf(stderr, "CORRECTNESS CHECK FAILED: http, %s: %lld charges for %lld keys%s\n", side.name.c_str(),
                   static_cast<long long>(charges->first), static_cast<long long>(keys_sent[side.name]),
                   charges->second ? ", a key charged twice" : "");
      rc = kExitCheckFailed;
    }
    groups[side.name] = o.group_commits ? static_cast<double>(o.grouped) / static_cast<double>(o.group_commits) : 0;
  }

  nlohmann::json out = {
      {"bench", "pooler"}, {"direct", RedactUrl(direct)},          {"pooled", RedactUrl(pooled)},
      {"rounds", *rounds}, {"target_pooled_over_direct", kTarget}, {"prepared_statements_in_session", prepared}};
  for (const Workload& w : workloads) {
    nlohmann::json j = {{"rounds", w.rounds}};
    if (w.name == "inbox") {
      j["consumers"] = *consumers;
      j["ids"] = std::string(bench::IdKindName(kind));
      j["seconds"] = *seconds;
    } else {
      j["requests"] = *requests;
      j["connections"] = *connections;
      j["group_commit"] = *group;
      j["committers"] = *committers;
      j["fibers"] = *fibers;
      j["mean_group"] = groups;
    }
    for (const SideSpec& side : sides) {
      j["median_per_s"][side.name] = Median(w.per_s.at(side.name));
      if (side.name == "direct") continue;
      const std::vector<double> ratios = Ratios(w, side.name);
      const double median = Median(ratios);
      j["median_" + side.name + "_over_direct"] = median;
      j["min_" + side.name + "_over_direct"] = *std::min_element(ratios.begin(), ratios.end());
      j["max_" + side.name + "_over_direct"] = *std::max_element(ratios.begin(), ratios.end());
      if (side.name == "pooled") j["met"] = median >= kTarget;
      if (!json)
        std::printf("%s: median %s/direct %.3f (rounds %.3f-%.3f)%s\n", w.name.c_str(), side.name.c_str(), median,
                    *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()),
                    side.name != "pooled" ? ""
                    : median >= kTarget   ? ", target >= 0.8: met"
                                          : ", target >= 0.8: NOT met");
    }
    out[w.name] = j;
  }
  if (json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    if (run_http) std::printf("http: mean group %s\n", groups.dump().c_str());
    std::printf("prepared statements in a session of each side: %s\n", prepared.dump().c_str());
  }
  std::fflush(stdout);
  for (const SideSpec& side : sides)
    if (opened[side.name].provider) opened[side.name].provider->Stop();
  return rc;
}

}  // namespace idem::cli
