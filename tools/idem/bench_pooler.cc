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

// The run's flags. The pooler's own flags take their defaults from the
// flag table (idem bench --help); those it shares with other benchmarks
// have defaults of its own here.
struct Settings {
  std::string direct, pooled;
  int64_t consumers = 4, rounds = 5, requests = 0, connections = 0, group = 64, committers = 0, fibers = 0;
  double seconds = 0;
  bench::IdKind kind = bench::IdKind::kRandom;
  bool run_inbox = false, run_http = false, json = false;
  std::vector<SideSpec> sides;
};

Result<Settings> ParseSettings(const Args& args) {
  Settings st;
  if (!args.Has("direct") || !args.Has("pooled"))
    return Status::InvalidArgument(
        "--direct URL (the server) and --pooled URL (the same server through the pooler) are both required");
  st.direct = args.Get("direct");
  st.pooled = args.Get("pooled");
  for (const std::string* u : {&st.direct, &st.pooled})
    if (!IsPostgresScheme(*u))
      return Status::InvalidArgument("--direct and --pooled must be postgres:// URLs, not " + RedactUrl(*u));
  auto consumers = args.Has("consumers") ? args.GetInt("consumers", 1, 64) : Result<int64_t>(st.consumers);
  auto seconds = args.GetDouble("seconds", 0.01, 3600);
  auto rounds = args.Has("rounds") ? args.GetInt("rounds", 1, 1000) : Result<int64_t>(st.rounds);
  auto requests = args.GetInt("requests", 1, 10'000'000);
  auto connections = args.GetInt("connections", 1, 256);
  auto group = args.Has("group-commit") ? args.GetInt("group-commit", 0, 10'000) : Result<int64_t>(st.group);
  auto committers = args.GetInt("committers", 1, 64);
  auto fibers = args.GetInt("fibers", 0, 64);
  for (const auto* r : {&consumers, &rounds, &requests, &connections, &group, &committers, &fibers})
    IDEM_RETURN_IF_ERROR(r->status());
  IDEM_ASSIGN_OR_RETURN(st.seconds, std::move(seconds));
  st.consumers = *consumers, st.rounds = *rounds, st.requests = *requests, st.connections = *connections;
  st.group = *group, st.committers = *committers, st.fibers = *fibers;
  if (st.fibers > 0 && st.group <= 1)
    return Status::InvalidArgument("--fibers needs --group-commit above 1 (give --fibers 0 without)");
  if (const std::string ids = args.Get("ids"); ids == "ordered") {
    st.kind = bench::IdKind::kOrdered;
  } else if (ids != "random") {
    return Status::InvalidArgument("--ids must be random or ordered, not '" + ids + "'");
  }
  const std::string which = args.Get("workloads");
  st.run_inbox = which == "inbox" || which == "inbox,http" || which == "http,inbox";
  st.run_http = which == "http" || which == "inbox,http" || which == "http,inbox";
  if (!st.run_inbox && !st.run_http)
    return Status::InvalidArgument("--workloads must be inbox, http or inbox,http, not '" + which + "'");
  st.sides = {{"direct", st.direct}, {"pooled", st.pooled}};
  if (args.Bool("unnamed")) {
    IDEM_ASSIGN_OR_RETURN(std::string u, Unnamed(st.direct));
    st.sides.push_back({"unnamed", u});
  }
  st.json = args.Bool("json");
  return st;
}

// Each side's store, inbox and provider.
Status OpenSides(const Settings& st, std::map<std::string, Opened>& opened) {
  for (const SideSpec& side : st.sides) {
    Opened& o = opened[side.name];
    auto store = OpenStore(side.url, true, static_cast<int>(st.consumers) + 1);
    if (!store.ok()) return store.status().WithContext(side.name);
    o.store = std::move(*store);
    if (side.name == "direct")
      IDEM_RETURN_IF_ERROR(bench::PrepareBusinessTable(*o.store).WithContext("business table"));
    IDEM_ASSIGN_OR_RETURN(o.inbox, Inbox::Open(*o.store, {.consumer = "pooler-ab-" + side.name}));
    if (!st.run_http) continue;
    ProviderServerOptions p;
    p.store_url = side.url;
    p.api_keys = {{kApiKey, kPrincipal}};
    p.one_transaction = true;
    p.idempotency.group_commit_max = static_cast<int>(st.group);
    p.idempotency.group_committers = static_cast<int>(st.committers);
    p.idempotency.max_keys_per_principal = int64_t{1} << 40;  // every round's keys stay stored
    p.fibers = static_cast<int>(st.fibers);
    auto provider = ProviderServer::Start(std::move(p));
    if (!provider.ok()) return provider.status().WithContext(side.name + " provider");
    o.provider = std::move(*provider);
  }
  return Status::OK();
}

void PrintHeader(const Settings& st) {
  std::printf("bench pooler: direct %s, pooled %s%s\n", RedactUrl(st.direct).c_str(), RedactUrl(st.pooled).c_str(),
              st.sides.size() > 2 ? ", unnamed: direct with ?idem_pooler=transaction" : "");
  if (st.run_inbox)
    std::printf("  inbox: Inbox::Handle per message, %lld consumers, %s ids, %.2f s per side and round\n",
                static_cast<long long>(st.consumers), std::string(bench::IdKindName(st.kind)).c_str(), st.seconds);
  if (st.run_http)
    std::printf(
        "  http: POST /charges first executions, one transaction, group commit %lld, %lld committer(s), %lld "
        "fiber thread(s), %lld connections, %lld keys per side and round\n",
        static_cast<long long>(st.group), static_cast<long long>(st.committers), static_cast<long long>(st.fibers),
        static_cast<long long>(st.connections), static_cast<long long>(st.requests));
  std::printf("  %lld rounds after a warm-up; sides alternate which goes first\n", static_cast<long long>(st.rounds));
  std::fflush(stdout);
}

// The rounds: what they measured and the keys each side sent.
struct Rounds {
  std::string run;  // the keys' prefix
  std::vector<Workload> workloads;
  std::map<std::string, int64_t> keys_sent;
};

// One side's rate in one round of workload `w`; false (reported) when an
// answer was not 201.
Result<bool> MeasureSide(const Settings& st, const SideSpec& side, Opened& o, const std::string& workload,
                         int64_t round, Rounds& rs, double& rate) {
  const bool warm = round == 0;
  const std::string cmd = "bench pooler";
  if (workload == "inbox") {
    bench::Side s;
    Inbox& inbox = *o.inbox;
    IDEM_RETURN_IF_ERROR(bench::ParallelRound(st.kind, static_cast<int>(st.consumers), 1,
                                              warm ? std::min(kWarmupSeconds, st.seconds) : st.seconds, &s,
                                              [&](std::span<const Message> b) { return bench::GuardedBatch(inbox, b); })
                             .WithContext("inbox, " + side.name));
    rate = s.rounds.back();
    return true;
  }
  const int64_t n = warm ? std::min(kWarmupRequests, st.requests) : st.requests;
  const auto posts = Charges(rs.run + side.name + "-" + std::to_string(round) + "-", n);
  const http::Idempotency::Counters before = o.provider->counters();
  const PostedAll r = PostAll(o.provider->port(), "/charges", posts, static_cast<int>(st.connections), 201, cmd);
  const http::Idempotency::Counters after = o.provider->counters();
  rs.keys_sent[side.name] += n;
  if (r.unexpected > 0) {
    std::fprintf(stderr, "CORRECTNESS CHECK FAILED: http, %s, round %lld: %lld of %lld answers not 201\n",
                 side.name.c_str(), static_cast<long long>(round), static_cast<long long>(r.unexpected),
                 static_cast<long long>(n));
    return false;
  }
  rate = static_cast<double>(n) / r.seconds;
  if (!warm) {
    o.group_commits += after.group_commits - before.group_commits;
    o.grouped += after.grouped_requests - before.grouped_requests;
  }
  return true;
}

// One measured round's line: each side's rate and its ratio to direct.
void RoundLine(const Settings& st, Workload& w, int64_t round, nlohmann::json& line) {
  const size_t i = w.per_s["direct"].size() - 1;
  std::string text;
  for (const SideSpec& side : st.sides) {
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
  if (!st.json) std::printf("round %lld %s%s\n", static_cast<long long>(round), w.name.c_str(), text.c_str());
  std::fflush(stdout);
}

// Round 0 warms up; then the measured rounds, the sides alternating which
// goes first. False when an answer was not 201.
Result<bool> RunRounds(const Settings& st, std::map<std::string, Opened>& opened, Rounds& rs) {
  for (int64_t round = 0; round <= st.rounds; ++round) {
    const bool warm = round == 0;
    for (Workload& w : rs.workloads) {
      nlohmann::json line = {{"round", round}};
      for (size_t k = 0; k < st.sides.size(); ++k) {
        const SideSpec& side = st.sides[(static_cast<size_t>(round) + k) % st.sides.size()];
        double rate = 0;
        IDEM_ASSIGN_OR_RETURN(bool answered, MeasureSide(st, side, opened[side.name], w.name, round, rs, rate));
        if (!answered) return false;
        if (!warm) w.per_s[side.name].push_back(rate);
        line[side.name + "_per_s"] = rate;
      }
      if (!warm) RoundLine(st, w, round, line);
    }
  }
  return true;
}

// The checks: one charge per key, every key charged; what the sessions hold
// and the mean group per side. False when a check failed (reported).
Result<bool> Check(const Settings& st, std::map<std::string, Opened>& opened, Rounds& rs, nlohmann::json& prepared,
                   nlohmann::json& groups) {
  bool ok = true;
  for (const SideSpec& side : st.sides) {
    Opened& o = opened[side.name];
    auto n = PreparedInSession(*o.store);
    if (!n.ok()) return n.status().WithContext(side.name);
    prepared[side.name] = *n;
    if (!st.run_http) continue;
    IDEM_ASSIGN_OR_RETURN(auto charges, ChargesFor(*opened["direct"].store, rs.run + side.name + "-"));
    if (charges.first != rs.keys_sent[side.name] || charges.second) {
      std::fprintf(stderr, "CORRECTNESS CHECK FAILED: http, %s: %lld charges for %lld keys%s\n", side.name.c_str(),
                   static_cast<long long>(charges.first), static_cast<long long>(rs.keys_sent[side.name]),
                   charges.second ? ", a key charged twice" : "");
      ok = false;
    }
    groups[side.name] = o.group_commits ? static_cast<double>(o.grouped) / static_cast<double>(o.group_commits) : 0;
  }
  return ok;
}

// The medians per workload (printed unless --json), and the JSON object.
nlohmann::json Report(const Settings& st, const Rounds& rs, const nlohmann::json& prepared,
                      const nlohmann::json& groups) {
  nlohmann::json out = {
      {"bench", "pooler"},   {"direct", RedactUrl(st.direct)},       {"pooled", RedactUrl(st.pooled)},
      {"rounds", st.rounds}, {"target_pooled_over_direct", kTarget}, {"prepared_statements_in_session", prepared}};
  for (const Workload& w : rs.workloads) {
    nlohmann::json j = {{"rounds", w.rounds}};
    if (w.name == "inbox") {
      j["consumers"] = st.consumers;
      j["ids"] = std::string(bench::IdKindName(st.kind));
      j["seconds"] = st.seconds;
    } else {
      j["requests"] = st.requests;
      j["connections"] = st.connections;
      j["group_commit"] = st.group;
      j["committers"] = st.committers;
      j["fibers"] = st.fibers;
      j["mean_group"] = groups;
    }
    for (const SideSpec& side : st.sides) {
      j["median_per_s"][side.name] = Median(w.per_s.at(side.name));
      if (side.name == "direct") continue;
      const std::vector<double> ratios = Ratios(w, side.name);
      const double median = Median(ratios);
      j["median_" + side.name + "_over_direct"] = median;
      j["min_" + side.name + "_over_direct"] = *std::min_element(ratios.begin(), ratios.end());
      j["max_" + side.name + "_over_direct"] = *std::max_element(ratios.begin(), ratios.end());
      if (side.name == "pooled") j["met"] = median >= kTarget;
      if (!st.json)
        std::printf("%s: median %s/direct %.3f (rounds %.3f-%.3f)%s\n", w.name.c_str(), side.name.c_str(), median,
                    *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()),
                    side.name != "pooled" ? ""
                    : median >= kTarget   ? ", target >= 0.8: met"
                                          : ", target >= 0.8: NOT met");
    }
    out[w.name] = j;
  }
  return out;
}

}  // namespace

int RunBenchPooler(const Args& args) {
  const std::string cmd = "bench pooler";
  auto settings = ParseSettings(args);
  if (!settings.ok()) return Fail(cmd, settings.status());
  const Settings& st = *settings;
  std::map<std::string, Opened> opened;
  if (Status s = OpenSides(st, opened); !s.ok()) return Fail(cmd, s);
  if (!st.json) PrintHeader(st);
  Rounds rs;
  rs.run = "pab" + std::to_string(Env::Default()->NowMs()) + "-";
  if (st.run_inbox) rs.workloads.push_back({"inbox"});
  if (st.run_http) rs.workloads.push_back({"http"});
  auto answered = RunRounds(st, opened, rs);
  if (!answered.ok()) return Fail(cmd, answered.status());
  if (!*answered) return kExitCheckFailed;
  nlohmann::json prepared = nlohmann::json::object(), groups = nlohmann::json::object();
  auto checked = Check(st, opened, rs, prepared, groups);
  if (!checked.ok()) return Fail(cmd, checked.status());
  const nlohmann::json out = Report(st, rs, prepared, groups);
  if (st.json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    if (st.run_http) std::printf("http: mean group %s\n", groups.dump().c_str());
    std::printf("prepared statements in a session of each side: %s\n", prepared.dump().c_str());
  }
  std::fflush(stdout);
  for (const SideSpec& side : st.sides)
    if (opened[side.name].provider) opened[side.name].provider->Stop();
  return *checked ? kExitOk : kExitCheckFailed;
}

}  // namespace idem::cli
