// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem schema | inspect | purge: see and clean what a store holds.
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <utility>

#include "commands.h"
#include "idem/claims.h"
#include "idem/embedded/queue.h"
#include "idem/env.h"
#include "idem/outbox.h"
#include "idem/retention.h"
#include "idem/url.h"
#include "sources.h"

namespace idem::cli {
namespace {

std::string Printable(const std::string& id) {
  std::string out;
  for (unsigned char c : id) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

}  // namespace

const Command& SchemaCommand() {
  static const Command c{"schema",
                         "Print the schema version and the tables idem keeps in a store; without --store,\n"
                         "the schema this build creates.",
                         "[--store URL] [--json]",
                         {{"store", "URL", "", "an existing store (sqlite:PATH or postgres://...)"},
                          {"json", "", "", "print one JSON object"}}};
  return c;
}

int RunSchema(const Args& args) {
  // Without --store: the schema this build creates, read from a new SQLite
  // file in a scratch directory (an in-memory database is not a store).
  std::optional<ScratchDir> scratch;
  if (!args.Has("store")) {
    auto dir = ScratchDir::Make("idem-schema");
    if (!dir.ok()) return Fail("schema", dir.status());
    scratch.emplace(std::move(*dir));
  }
  auto store = scratch ? OpenStore("sqlite:" + scratch->path() + "/schema.db") : OpenStore(args.Get("store"), false);
  if (!store.ok()) return Fail("schema", store.status());
  auto info = (*store)->Schema();
  if (!info.ok()) return Fail("schema", info.status());
  if (args.Bool("json")) {
    std::vector<std::string> items;
    for (const auto& st : info->statements) items.push_back(JsonString(st));
    std::cout << Json()
                     .Add("store", std::string((*store)->Kind()))
                     .Add("version", info->version)
                     .AddRaw("statements", JsonArray(items))
                     .str()
              << "\n";
    return kExitOk;
  }
  std::cout << "-- idem schema version " << info->version << " (" << (*store)->Kind() << ")\n";
  for (const auto& s : info->statements) std::cout << s << ";\n";
  return kExitOk;
}

const Command& InspectCommand() {
  static const Command c{"inspect",
                         "Show what a store holds: marker count, recent markers, dead letters and claims\n"
                         "(two-phase records); with SCOPE KEY, one claim record; with --queue, the state\n"
                         "of an embedded queue. --queue alone looks at the queue only (no store is opened,\n"
                         "none needs to exist). Exit 1 when the claim asked for does not exist.",
                         "[SCOPE KEY] [--store URL] [--consumer NAME] [--limit N] [--queue embedded:PATH] [--json]",
                         {{"store", "URL", "sqlite:idem.db",
                           "the store (sqlite:PATH or postgres://...); not opened when only\n"
                           "          --queue is given"},
                          {"consumer", "NAME", "", "only this consumer (default: all)"},
                          {"limit", "N", "10", "how many recent markers and dead letters to list"},
                          {"queue", "URL", "", "show an embedded queue (embedded:PATH[?queue=NAME]); never created"},
                          {"json", "", "", "print one JSON object"}},
                         /*max_positional=*/2};
  return c;
}

namespace {

std::string ClaimJson(const ClaimRecord& c) {
  return Json()
      .Add("scope", c.scope)
      .Add("key", c.key)
      .Add("state", std::string(StateName(c.state)))
      .Add("fence", c.fence)
      .Add("lease_until_ms", c.lease_until_ms)
      .Add("expires_at_ms", c.expires_at_ms)
      .Add("fingerprint", ToHex(c.fingerprint))
      .Add("result_bytes", static_cast<int64_t>(c.result.size()))
      .Add("result_is_error", c.result_is_error)
      .Add("updated_at_ms", c.updated_at_ms)
      .str();
}

std::string ClaimLine(const ClaimRecord& c, int64_t now_ms) {
  std::string s = "  " + Printable(c.scope) + "  " + Printable(c.key) + "  " + std::string(StateName(c.state)) +
                  "  fence " + std::to_string(c.fence);
  if (c.state == ClaimRecord::State::kInProgress) {
    const int64_t left = c.lease_until_ms - now_ms;
    s += left > 0 ? "  lease ends in " + std::to_string(left) + " ms"
                  : "  lease ended " + std::to_string(-left) + " ms ago";
  } else {
    s += "  result " + std::to_string(c.result.size()) + " bytes" + (c.result_is_error ? " (a stored error)" : "") +
         "  expires in " + std::to_string(c.expires_at_ms - now_ms) + " ms";
  }
  return s + "  sha256 " + ToHex(c.fingerprint).substr(0, 16) + "...";
}

// `idem inspect SCOPE KEY`: one claim record.
int InspectClaim(ClaimStore& claims, const std::string& scope, const std::string& key, bool json) {
  auto rec = claims.FindClaim(scope, key);
  if (!rec.ok()) return Fail("inspect", rec.status());
  auto now = claims.NowMs();
  if (!now.ok()) return Fail("inspect", now.status());
  if (!rec->has_value()) {
    if (json) std::cout << Json().Add("found", false).Add("scope", scope).Add("key", key).str() << "\n";
    std::cerr << "idem inspect: no claim for key '" << Printable(key) << "' in scope '" << Printable(scope)
              << "' (never claimed, released, or expired and purged)\n";
    return kExitCheckFailed;
  }
  if (json) {
    std::cout << ClaimJson(**rec) << "\n";
  } else {
    std::cout << "claim (store clock " << *now << " ms):\n" << ClaimLine(**rec, *now) << "\n";
  }
  return kExitOk;
}

// Inspect on a store that keeps claims only (Redis).
int InspectClaimsOnly(const Args& args, int limit) {
  auto opened = OpenClaimStore(args.Get("store"));
  if (!opened.ok()) return Fail("inspect", opened.status());
  ClaimStore& cs = *opened->claims;
  if (args.positional().size() == 2)
    return InspectClaim(cs, args.positional()[0], args.positional()[1], args.Bool("json"));
  auto listed = cs.ListClaims("", limit);
  if (!listed.ok()) return Fail("inspect", listed.status());
  auto now = cs.NowMs();
  if (!now.ok()) return Fail("inspect", now.status());
  if (args.Bool("json")) {
    std::vector<std::string> items;
    for (const auto& c : *listed) items.push_back(ClaimJson(c));
    std::cout << Json().AddRaw("claims", JsonArray(items)).str() << "\n";
    return kExitOk;
  }
  std::cout << "claims: " << listed->size() << (listed->size() == static_cast<size_t>(limit) ? "+" : "") << "\n";
  for (const auto& c : *listed) std::cout << ClaimLine(c, *now) << "\n";
  return kExitOk;
}

// The options of the embedded queue at `url`, whose file must be there:
// looking must not create one (kNotFound when none is).
Result<embedded::Queue::Options> ExistingQueue(const std::string& url) {
  IDEM_ASSIGN_OR_RETURN(embedded::Queue::Options qo, embedded::Queue::ParseUrl(url));
  std::error_code ec;
  if (!std::filesystem::exists(qo.path, ec)) return Status::NotFound("no queue file at " + qo.path);
  return qo;
}

// The counts of the embedded queue at `url`.
Result<embedded::QueueStats> QueueStatsAt(const std::string& url) {
  IDEM_ASSIGN_OR_RETURN(embedded::Queue::Options qo, ExistingQueue(url));
  IDEM_ASSIGN_OR_RETURN(auto q, embedded::Queue::Open(qo));
  return q->Stats();
}

std::string QueueJson(const embedded::QueueStats& qs) {
  return Json()
      .Add("ready", qs.ready)
      .Add("leased", qs.leased)
      .Add("delayed", qs.delayed)
      .Add("published", qs.published)
      .Add("acked", qs.acked)
      .str();
}

std::string QueueLine(const embedded::QueueStats& qs) {
  return "queue: ready " + std::to_string(qs.ready) + ", leased " + std::to_string(qs.leased) + ", delayed " +
         std::to_string(qs.delayed) + ", published " + std::to_string(qs.published) + ", acked " +
         std::to_string(qs.acked);
}

// `idem inspect --queue URL` without a store.
int InspectQueue(const std::string& url, bool json) {
  auto qs = QueueStatsAt(url);
  if (!qs.ok()) return Fail("inspect", qs.status());
  if (json) {
    std::cout << Json().AddRaw("queue", QueueJson(*qs)).str() << "\n";
  } else {
    std::cout << QueueLine(*qs) << "\n";
  }
  return kExitOk;
}

// The outbox of a store that has one (idem/outbox.h); nullopt when it has none.
struct OutboxView {
  OutboxStats stats;
  std::vector<OutboxDeadLetter> dead;
  int64_t now_ms = 0;
};
Result<std::optional<OutboxView>> ReadOutbox(Store& store, int limit) {
  if (store.outbox_store() == nullptr) return std::optional<OutboxView>();
  IDEM_ASSIGN_OR_RETURN(auto outbox, Outbox::Open(store));
  OutboxView v;
  IDEM_ASSIGN_OR_RETURN(v.stats, outbox->Stats());
  IDEM_ASSIGN_OR_RETURN(v.dead, outbox->ListDeadLetters(limit));
  v.now_ms = Env::Default()->NowMs();
  return std::optional<OutboxView>(std::move(v));
}

int64_t OldestUnsentAgeMs(const OutboxView& v) {
  return v.stats.oldest_unsent_ms ? std::max<int64_t>(0, v.now_ms - *v.stats.oldest_unsent_ms) : 0;
}

std::string OutboxJson(const OutboxView& v) {
  std::vector<std::string> ds;
  for (const auto& d : v.dead)
    ds.push_back(Json()
                     .Add("id", d.row.id)
                     .Add("destination", d.row.destination)
                     .Add("key", d.row.key)
                     .Add("reason", d.reason)
                     .Add("error", d.error)
                     .Add("attempts", d.row.attempts)
                     .Add("at_ms", d.at_ms)
                     .str());
  return Json()
      .Add("backlog", v.stats.backlog)
      .Add("oldest_unsent_age_ms", OldestUnsentAgeMs(v))
      .Add("sent_kept", v.stats.sent_kept)
      .Add("dead_letter_count", v.stats.dead_letters)
      .Add("relays", v.stats.relays)
      .AddRaw("dead_letters", JsonArray(ds))
      .str();
}

void PrintOutbox(const OutboxView& v, int limit) {
  std::cout << "outbox: backlog " << v.stats.backlog;
  if (v.stats.oldest_unsent_ms) std::cout << " (oldest unsent " << OldestUnsentAgeMs(v) << " ms ago)";
  std::cout << ", sent kept " << v.stats.sent_kept << ", relays live " << v.stats.relays << "\n";
  std::cout << "outbox dead letters: " << v.stats.dead_letters
            << (v.dead.size() == static_cast<size_t>(limit) && v.stats.dead_letters > limit ? " (newest listed)" : "")
            << "\n";
  for (const auto& d : v.dead)
    std::cout << "  " << Printable(d.row.id) << "  to " << Printable(d.row.destination) << "  key "
              << Printable(d.row.key) << "  " << d.reason << " after " << d.row.attempts << " attempt(s): " << d.error
              << "\n";
}

}  // namespace

int RunInspect(const Args& args) {
  auto limit = args.GetInt("limit", 1, 1'000'000);
  if (!limit.ok()) return Fail("inspect", limit.status());
  if (args.positional().size() != 0 && args.positional().size() != 2)
    return Fail("inspect", Status::InvalidArgument("give both SCOPE and KEY of a claim, or neither"));
  // --queue alone looks at the queue only: a queue can be looked at
  // without a store (the default one need not exist).
  const bool store_wanted =
      args.Has("store") || !args.Has("queue") || !args.positional().empty() || args.Has("consumer");
  if (!store_wanted) return InspectQueue(args.Get("queue"), args.Bool("json"));
  if (IsClaimsOnlyUrl(args.Get("store"))) return InspectClaimsOnly(args, static_cast<int>(*limit));
  auto store = OpenStore(args.Get("store"), false);
  if (!store.ok()) return Fail("inspect", store.status());
  ClaimStore* claim_store = (*store)->claim_store();
  if (args.positional().size() == 2) {
    if (claim_store == nullptr) return Fail("inspect", Status::InvalidArgument("this store keeps no claims"));
    return InspectClaim(*claim_store, args.positional()[0], args.positional()[1], args.Bool("json"));
  }
  std::vector<ClaimRecord> claims;
  int64_t claims_now = 0;
  if (claim_store != nullptr) {
    auto listed = claim_store->ListClaims("", static_cast<int>(*limit));
    if (!listed.ok()) return Fail("inspect", listed.status());
    claims = std::move(*listed);
    auto now = claim_store->NowMs();
    if (!now.ok()) return Fail("inspect", now.status());
    claims_now = *now;
  }
  std::string consumer = args.Get("consumer");
  auto count = (*store)->CountMarkers(consumer);
  if (!count.ok()) return Fail("inspect", count.status());
  auto markers = (*store)->ListMarkers(consumer, static_cast<int>(*limit));
  if (!markers.ok()) return Fail("inspect", markers.status());
  auto dead = (*store)->ListDeadLetters(consumer, static_cast<int>(*limit));
  if (!dead.ok()) return Fail("inspect", dead.status());
  auto outbox = ReadOutbox(**store, static_cast<int>(*limit));
  if (!outbox.ok()) return Fail("inspect", outbox.status());
  std::optional<embedded::QueueStats> qs;
  if (args.Has("queue")) {
    auto st = QueueStatsAt(args.Get("queue"));
    if (!st.ok()) return Fail("inspect", st.status());
    qs = *st;
  }
  if (args.Bool("json")) {
    std::vector<std::string> ms, ds;
    for (const auto& m : *markers)
      ms.push_back(Json()
                       .Add("consumer", m.consumer)
                       .Add("id", m.id)
                       .Add("fingerprint", ToHex(m.fingerprint))
                       .Add("processed_at_ms", m.processed_at_ms)
                       .str());
    for (const auto& d : *dead)
      ds.push_back(Json()
                       .Add("consumer", d.consumer)
                       .Add("id", d.id)
                       .Add("reason", d.reason)
                       .Add("error", d.error)
                       .Add("attempts", d.attempts)
                       .Add("at_ms", d.at_ms)
                       .str());
    Json j;
    std::vector<std::string> cs;
    cs.reserve(claims.size());
    for (const auto& c : claims) cs.push_back(ClaimJson(c));
    j.Add("markers", *count).AddRaw("recent", JsonArray(ms)).AddRaw("dead_letters", JsonArray(ds));
    j.AddRaw("claims", JsonArray(cs));
    if (*outbox) j.AddRaw("outbox", OutboxJson(**outbox));
    if (qs) {
      j.AddRaw("queue", QueueJson(*qs));
    }
    std::cout << j.str() << "\n";
    return kExitOk;
  }
  std::cout << "markers: " << *count << (consumer.empty() ? "" : " (consumer " + consumer + ")") << "\n";
  for (const auto& m : *markers)
    std::cout << "  " << m.consumer << "  " << Printable(m.id) << "  at " << m.processed_at_ms << "  sha256 "
              << ToHex(m.fingerprint).substr(0, 16) << "...\n";
  std::cout << "dead letters: " << dead->size() << (dead->size() == static_cast<size_t>(*limit) ? "+" : "") << "\n";
  for (const auto& d : *dead)
    std::cout << "  " << d.consumer << "  " << Printable(d.id) << "  " << d.reason << " after " << d.attempts
              << " attempt(s): " << d.error << "\n";
  std::cout << "claims (most recently changed): " << claims.size()
            << (claims.size() == static_cast<size_t>(*limit) ? "+" : "") << "\n";
  for (const auto& c : claims) std::cout << ClaimLine(c, claims_now) << "\n";
  if (*outbox) PrintOutbox(**outbox, static_cast<int>(*limit));
  if (qs) std::cout << QueueLine(*qs) << "\n";
  return kExitOk;
}

const Command& PurgeCommand() {
  static const Command c{
      "purge",
      "Delete markers older than a retention, in bounded batches, claim records whose retention ended\n"
      "(completed) or whose lease ended longer than the retention ago (abandoned in progress), and outbox\n"
      "messages sent before the cutoff (with --outbox-dead, the outbox's dead letters too).\n"
      "A purged id is forgotten: a late duplicate of it would be applied again, so the retention must\n"
      "cover the longest redelivery or replay your source can make (the embedded queue redelivers until\n"
      "acked; Kafka can replay its whole retention). With --source (the consumer's source, which reports\n"
      "the oldest message it may still deliver) and/or --horizon (declared), a purge whose cut lies after\n"
      "that redelivery horizon is refused, nothing deleted, with exit 1, unless --force.",
      "--older-than DURATION [--store URL] [--consumer NAME] [--scope SCOPE] [--batch N] [--outbox-dead]\n"
      "       [--source URL] [--horizon DURATION] [--force] [--json]",
      {{"store", "URL", "sqlite:idem.db", "the store (sqlite:PATH or postgres://...)"},
       {"older-than", "DURATION", "7d", "retention: markers processed before now minus this go (90s, 15m, 24h, 7d)"},
       {"consumer", "NAME", "", "only this consumer's markers; claim records are left alone unless --scope"},
       {"scope", "SCOPE", "", "only this scope's claim records; markers are left alone unless --consumer"},
       {"batch", "N", "10000", "markers (and outbox messages) deleted per transaction"},
       {"outbox-dead", "", "", "also delete the outbox's dead letters from before the cutoff"},
       {"source", "URL", "",
        "the markers' source (as idem run --source): refuse to purge markers processed after the\n"
        "          oldest message it may still deliver (its redelivery horizon); an embedded queue file\n"
        "          must exist"},
       {"horizon", "DURATION", "",
        "declared horizon: messages up to this old may still be delivered or replayed (sources\n"
        "          that cannot tell, e.g. RabbitMQ; a replay window); with --source, the older one holds"},
       {"force", "", "", "purge even markers processed after the horizon"},
       {"json", "", "", "print one JSON object"}}};
  return c;
}

namespace {

// The horizon of the source at `url`, opened as idem run opens it and named
// by its URL (password hidden).
Result<NamedHorizon> SourceHorizon(const std::string& url) {
  // An embedded queue made here would be empty, and say nothing is left.
  if (UrlScheme(url) == "embedded") IDEM_RETURN_IF_ERROR(ExistingQueue(url).status());
  IDEM_ASSIGN_OR_RETURN(OpenedSource opened, OpenSource(url, {}));
  auto h = HorizonOf(*opened.source, RedactUrl(url));
  if (opened.close) (void)opened.close();
  return h;
}

// The horizon that guards a purge: --source's, --horizon's, or the older of
// the two; nullopt when neither flag is given (an unguarded purge).
Result<std::optional<NamedHorizon>> PurgeHorizon(const Args& args, int64_t now_ms) {
  if (!args.Has("source") && !args.Has("horizon")) return std::optional<NamedHorizon>();
  NamedHorizon h{RedeliveryHorizon::Unknown(), ""};
  if (args.Has("horizon")) {
    IDEM_ASSIGN_OR_RETURN(int64_t declared, ParseDurationMs(args.Get("horizon")));
    h = DeclaredHorizon(now_ms - declared, "the declared --horizon " + args.Get("horizon"));
  }
  if (args.Has("source")) {
    IDEM_ASSIGN_OR_RETURN(NamedHorizon reported, SourceHorizon(args.Get("source")));
    h = EarlierHorizon(reported, h);
  }
  return std::optional<NamedHorizon>(std::move(h));
}

// The shortest --older-than (in whole minutes, hours or days, rounded up)
// whose cut is at or before a horizon `age_ms` old.
std::string OlderThanCovering(int64_t age_ms) {
  const std::pair<int64_t, const char*> units[] = {{60'000, "m"}, {3'600'000, "h"}, {86'400'000, "d"}};
  size_t u = age_ms < 2 * 3'600'000 ? 0 : age_ms < 3 * 86'400'000 ? 1 : 2;
  const int64_t len = units[u].first;
  return std::to_string(std::max<int64_t>(1, (age_ms + len - 1) / len)) + units[u].second;
}

void AddHorizonJson(Json& j, const NamedHorizon& h) {
  using Kind = RedeliveryHorizon::Kind;
  j.Add("horizon", h.horizon.kind == Kind::kAt ? "at" : h.horizon.kind == Kind::kNone ? "none" : "unknown");
  if (h.horizon.kind == Kind::kAt) j.Add("horizon_ms", h.horizon.at_ms);
  j.Add("horizon_from", h.from);
}

}  // namespace

int RunPurge(const Args& args) {
  auto older = ParseDurationMs(args.Get("older-than"));
  if (!older.ok()) return Fail("purge", older.status());
  auto batch = args.GetInt("batch", 1, 1'000'000);
  if (!batch.ok()) return Fail("purge", batch.status());
  // With a filter, only what it names is purged: --consumer markers,
  // --scope claim records; with neither, both kinds.
  const std::string consumer = args.Get("consumer"), scope = args.Get("scope");
  const bool markers = !consumer.empty() || scope.empty();
  const bool claim_records = !scope.empty() || consumer.empty();
  if (IsClaimsOnlyUrl(args.Get("store"))) {
    if (args.Has("source") || args.Has("horizon"))
      return Fail("purge", Status::InvalidArgument("--source and --horizon guard markers, and " + args.Get("store") +
                                                   " keeps only claim records"));
    if (!consumer.empty())
      return Fail("purge", Status::InvalidArgument("--consumer names markers, and " + args.Get("store") +
                                                   " keeps only claim records (use --scope)"));
    auto opened = OpenClaimStore(args.Get("store"));
    if (!opened.ok()) return Fail("purge", opened.status());
    auto c = opened->claims->PurgeClaims(scope, *older, static_cast<int>(*batch));
    if (!c.ok()) return Fail("purge", c.status());
    if (args.Bool("json"))
      std::cout << Json().Add("claims_purged", *c).str() << "\n";
    else
      std::cout << "purged " << *c << " claim record(s)\n";
    return kExitOk;
  }
  auto store = OpenStore(args.Get("store"), false);
  if (!store.ok()) return Fail("purge", store.status());
  const int64_t now = Env::Default()->NowMs();
  const int64_t before = now - *older;
  // The horizon guards the markers; refused, the command deletes nothing.
  std::optional<NamedHorizon> horizon;
  bool forced = false;
  if (markers) {
    auto h = PurgeHorizon(args, now);
    if (!h.ok()) return Fail("purge", h.status());
    horizon = std::move(*h);
  }
  if (horizon) {
    if (Status guard = CheckPurgeBefore(before, *horizon); !guard.ok()) {
      if (!args.Bool("force")) {
        if (args.Bool("json")) {
          Json j;
          j.Add("refused", true).Add("before_ms", before);
          AddHorizonJson(j, *horizon);
          std::cout << j.str() << "\n";
        }
        const std::string hint = horizon->horizon.known()
                                     ? "--older-than " + OlderThanCovering(now - horizon->horizon.at_ms) + " or longer"
                                     : "--horizon DURATION";
        std::cerr << "idem purge: " << guard.message() << " (here: " << hint << ", or --force)\n";
        return kExitCheckFailed;
      }
      forced = true;
    }
  }
  std::optional<int64_t> purged, claims;
  if (markers) {
    auto n =
        horizon
            ? PurgeMarkers(
                  **store,
                  {.consumer = consumer, .before_ms = before, .batch_size = static_cast<int>(*batch), .force = forced},
                  *horizon)
            : (*store)->Purge(consumer, before, static_cast<int>(*batch));
    if (!n.ok()) return Fail("purge", n.status());
    purged = *n;
    // By age alone: say what was not checked (scripts read stdout).
    if (!horizon && *n > 0)
      std::cerr << "idem purge: markers purged by age alone, no redelivery horizon checked: a message still in its "
                   "source applies again if it comes (--source URL or --horizon DURATION guard the purge)\n";
  }
  ClaimStore* cs = (*store)->claim_store();
  if (claim_records && cs != nullptr) {
    auto c = cs->PurgeClaims(scope, *older, static_cast<int>(*batch));
    if (!c.ok()) return Fail("purge", c.status());
    claims = *c;
  }
  // The outbox is purged unless a filter names markers or claims only.
  std::optional<int64_t> outbox_purged;
  if (consumer.empty() && scope.empty() && (*store)->outbox_store() != nullptr) {
    auto outbox = Outbox::Open(**store);
    if (!outbox.ok()) return Fail("purge", outbox.status());
    auto n = (*outbox)->Purge(before, args.Bool("outbox-dead") ? before : 0, static_cast<int>(*batch));
    if (!n.ok()) return Fail("purge", n.status());
    outbox_purged = *n;
  }
  if (args.Bool("json")) {  // a kind left alone has no count
    Json j;
    if (purged) j.Add("purged", *purged).Add("before_ms", before);
    if (horizon) {
      AddHorizonJson(j, *horizon);
      j.Add("forced", forced);
    }
    if (claims) j.Add("claims_purged", *claims);
    if (outbox_purged) j.Add("outbox_purged", *outbox_purged);
    std::cout << j.str() << "\n";
  } else {
    std::string what;
    if (purged) what = std::to_string(*purged) + " marker(s) processed before " + std::to_string(before) + " ms";
    if (horizon && horizon->horizon.kind == RedeliveryHorizon::Kind::kAt)
      what += std::string(forced ? " (forced past" : " (at or before") + " the redelivery horizon " +
              std::to_string(horizon->horizon.at_ms) + " ms of " + horizon->from + ")";
    if (claims) what += (what.empty() ? "" : " and ") + std::to_string(*claims) + " claim record(s)";
    if (outbox_purged)
      what += (what.empty() ? "" : " and ") + std::to_string(*outbox_purged) +
              (args.Bool("outbox-dead") ? " outbox message(s) and dead letter(s)" : " sent outbox message(s)");
    std::cout << "purged " << (what.empty() ? "nothing (this store keeps no claim records)" : what) << "\n";
  }
  return kExitOk;
}

}  // namespace idem::cli
