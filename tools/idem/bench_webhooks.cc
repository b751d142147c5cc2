// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem bench webhooks: verified webhooks per second, first deliveries and
// replays, for two receivers served side by side by one HTTP server in this
// process on 127.0.0.1, with the same senders:
//   idem:   idem::http::WebhookReceiver (Standard Webhooks signature, the
//           event's marker and its row in one transaction, group commit
//           --group-commit) on --store;
//   redis:  the usual hand-rolled receiver: the same WebhookVerifier, then
//           Redis SET webhook:<id> 1 NX EX 604800 (--redis), and for a new
//           event its row in its own transaction on the same --store (a
//           failed insert deletes the key so the retry runs again).
// Either side answers 200 only once the event's row is committed (durable
// on SQLite's synchronous=FULL, the store's default). --concurrency senders
// post pre-signed deliveries over keep-alive connections: --messages fresh
// events per round (first deliveries), then the same deliveries again
// (replays). Rounds alternate which side goes first. Checks every answer is
// 200 and every event has one row; exit 1 if not.
#include <hiredis/hiredis.h>
#include <httplib.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "http_load.h"
#include "idem/http/webhook.h"
#include "idem/httplib/middleware.h"
#include "idem/url.h"

namespace idem::cli {
namespace {

constexpr const char* kSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
constexpr const char* kSides[] = {"idem", "redis"};

// Connections to Redis, one per server thread at a time.
class RedisPool {
 public:
  RedisPool(std::string host, int port, int db) : host_(std::move(host)), port_(port), db_(db) {}
  ~RedisPool() {
    for (redisContext* c : free_) redisFree(c);
  }
  Result<redisContext*> Take() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!free_.empty()) {
        redisContext* c = free_.back();
        free_.pop_back();
        return c;
      }
    }
    redisContext* c = redisConnect(host_.c_str(), port_);
    if (c == nullptr || c->err) {
      std::string why = c ? c->errstr : "out of memory";
      if (c) redisFree(c);
      return Status::Unavailable("cannot connect to Redis at " + host_ + ":" + std::to_string(port_) + ": " + why);
    }
    auto* r = static_cast<redisReply*>(redisCommand(c, "SELECT %d", db_));
    const bool selected = r != nullptr && r->type == REDIS_REPLY_STATUS;
    if (r) freeReplyObject(r);
    if (!selected) {
      redisFree(c);
      return Status::Unavailable("Redis at " + host_ + ":" + std::to_string(port_) + " refused SELECT " +
                                 std::to_string(db_));
    }
    return c;
  }
  void Give(redisContext* c, bool healthy) {
    if (!healthy) return redisFree(c);
    std::lock_guard<std::mutex> l(mu_);
    free_.push_back(c);
  }

 private:
  std::string host_;
  int port_, db_;
  std::mutex mu_;
  std::vector<redisContext*> free_;
};

// The hand-rolled receiver: verify, SET NX, insert.
http::Answer HandRolled(const http::WebhookVerifier& verifier, RedisPool& redis, Store& store,
                        const http::Request& request) {
  http::Answer a;
  auto ev = verifier.Verify(request);
  if (!ev.ok()) {
    a.status = ev.status().IsRejected() ? 401 : 400;
    a.SetBody(ev.status().message(), "text/plain");
    return a;
  }
  auto c = redis.Take();
  if (!c.ok()) {
    a.status = 500;
    a.SetBody(c.status().ToString(), "text/plain");
    return a;
  }
  const std::string key = "webhook:" + ev->id;
  auto* reply = static_cast<redisReply*>(redisCommand(*c, "SET %b 1 NX EX 604800", key.data(), key.size()));
  const bool fresh = reply != nullptr && reply->type == REDIS_REPLY_STATUS;
  const bool seen = reply != nullptr && reply->type == REDIS_REPLY_NIL;
  if (reply) freeReplyObject(reply);
  if (!fresh) {
    redis.Give(*c, seen);
    a.status = seen ? 200 : 500;
    a.SetBody(seen ? R"({"outcome":"duplicate"})" : R"({"outcome":"failed"})", "application/json");
    return a;
  }
  Status s = [&]() -> Status {
    IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
    IDEM_RETURN_IF_ERROR(
        tx->Exec("INSERT INTO bench_webhook_events_redis(id, body) VALUES ($1, $2)", {ev->id, request.body}).status());
    return tx->Commit();
  }();
  if (!s.ok()) {  // forget the id, so the sender's retry runs the work again
    if (auto* r = static_cast<redisReply*>(redisCommand(*c, "DEL %b", key.data(), key.size()))) freeReplyObject(r);
  }
  redis.Give(*c, true);
  a.status = s.ok() ? 200 : 500;
  a.SetBody(s.ok() ? R"({"outcome":"applied"})" : R"({"outcome":"failed"})", "application/json");
  return a;
}

Result<int64_t> Rows(Store& store, const std::string& table, const std::string& prefix) {
  IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
  IDEM_ASSIGN_OR_RETURN(auto rows, tx->Query("SELECT count(*), count(DISTINCT id) FROM " + table +
                                                 " WHERE substr(id, 1, length($1)) = $1",
                                             {prefix}));
  if (rows.rows[0][0].AsInt() != rows.rows[0][1].AsInt()) return int64_t{-1};  // an event twice
  return rows.rows[0][0].AsInt();
}

}  // namespace

int RunBenchWebhooks(const Args& args) {
  const std::string cmd = "bench webhooks";
  if (!args.Has("redis")) return Fail(cmd, Status::InvalidArgument("--redis URL is required (the hand-rolled side)"));
  auto redis_url = ParseUrl(args.Get("redis"), "Redis URL");
  if (!redis_url.ok()) return Fail(cmd, redis_url.status());
  if (redis_url->scheme != "redis" || redis_url->hosts.size() != 1)
    return Fail(cmd,
                Status::InvalidArgument("--redis must be redis://HOST:PORT[/DB], not " + RedactUrl(args.Get("redis"))));
  const std::string redis_host = redis_url->hosts[0].host;
  const int redis_port = redis_url->hosts[0].port ? redis_url->hosts[0].port : 6379;
  const std::optional<int64_t> redis_db =
      redis_url->path.size() > 1 ? ParseInteger(redis_url->path.substr(1)) : std::optional<int64_t>(0);
  if (!redis_db || *redis_db < 0 || *redis_db > 1000)
    return Fail(cmd, Status::InvalidArgument("--redis: the database after '/' must be a number, not '" +
                                             redis_url->path.substr(1) + "'"));
  auto events = args.Has("messages") ? args.GetInt("messages", 1, 10'000'000) : Result<int64_t>(2000);
  auto senders = args.Has("concurrency") ? args.GetInt("concurrency", 1, 256) : Result<int64_t>(16);
  auto rounds = args.GetInt("rounds", 1, 1000);
  auto group = args.GetInt("group-commit", 0, 10'000);
  for (const auto* r : {&events, &senders, &rounds, &group})
    if (!r->ok()) return Fail(cmd, r->status());
  auto store = OpenStore(args.Get("store"), true, static_cast<int>(*senders) + 2);
  if (!store.ok()) return Fail(cmd, store.status());
  {
    auto tx = (*store)->Begin();
    Status s = tx.ok() ? Status::OK() : tx.status();
    for (const char* table : {"bench_webhook_events", "bench_webhook_events_redis"}) {
      if (s.ok())
        s = (*tx)->Exec(std::string("CREATE TABLE IF NOT EXISTS ") + table + "(id TEXT NOT NULL, body TEXT)").status();
      if (s.ok()) s = (*tx)->Exec(std::string("DELETE FROM ") + table).status();
    }
    if (s.ok()) s = (*tx)->Commit();
    if (!s.ok()) return Fail(cmd, s);
  }
  RedisPool redis(redis_host, redis_port, static_cast<int>(*redis_db));
  {
    auto c = redis.Take();
    if (!c.ok()) return Fail(cmd, c.status());
    redis.Give(*c, true);
  }
  auto verifier = http::WebhookVerifier::Open({.secrets = {kSecret}});
  auto receiver = http::WebhookReceiver::Open(
      **store,
      [](Transaction& tx, const Message& m) -> Status {
        return tx.Exec("INSERT INTO bench_webhook_events(id, body) VALUES ($1, $2)", {m.id, m.payload}).status();
      },
      {.verify = {.secrets = {kSecret}}, .consumer = "bench-webhooks", .group_commit_max = static_cast<int>(*group)});
  if (!verifier.ok()) return Fail(cmd, verifier.status());
  if (!receiver.ok()) return Fail(cmd, receiver.status());

  ::httplib::Server server;
  const size_t pool = static_cast<size_t>(*senders) + 2;
  server.new_task_queue = [pool] { return new ::httplib::ThreadPool(pool); };
  server.set_keep_alive_max_count(1'000'000);
  server.set_tcp_nodelay(true);
  server.Post("/idem", [&](const ::httplib::Request& req, ::httplib::Response& res) {
    idem::httplib::WriteAnswer((*receiver)->Handle(idem::httplib::ToRequest(req)), res);
  });
  server.Post("/redis", [&](const ::httplib::Request& req, ::httplib::Response& res) {
    idem::httplib::WriteAnswer(HandRolled(**verifier, redis, **store, idem::httplib::ToRequest(req)), res);
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  if (port <= 0) return Fail(cmd, Status::Unavailable("cannot listen on 127.0.0.1"));
  std::thread serving([&] { server.listen_after_bind(); });

  const bool json = args.Bool("json");
  const std::string run = std::to_string(Env::Default()->NowMs());
  std::map<std::string, std::vector<double>> first, replay;
  nlohmann::json rounds_json = nlohmann::json::array();
  int rc = kExitOk;
  if (!json) {
    std::printf("webhooks: %lld events per round and side, %lld senders, %lld rounds, store %s, group commit %lld\n",
                static_cast<long long>(*events), static_cast<long long>(*senders), static_cast<long long>(*rounds),
                RedactUrl(args.Get("store")).c_str(), static_cast<long long>(*group));
    std::printf("%-6s %-6s %14s %14s\n", "round", "side", "first/s", "replays/s");
  }
  for (int64_t round = 0; round < *rounds + 1 && rc == kExitOk; ++round) {  // round 0 warms up
    for (int k = 0; k < 2 && rc == kExitOk; ++k) {
      const std::string side = kSides[(round + k) % 2];
      const std::string prefix = "r" + run + "-" + std::to_string(round) + "-" + side + "-";
      std::vector<HttpPost> deliveries;
      deliveries.reserve(static_cast<size_t>(*events));
      const int64_t now_s = Env::Default()->NowMs() / 1000;
      for (int64_t i = 0; i < *events; ++i) {
        HttpPost d;
        const std::string id = prefix + std::to_string(i);
        d.body = R"({"type":"invoice.paid","data":{"invoice":"in_)" + std::to_string(i) + R"(","amount_due":4000}})";
        auto h = http::SignWebhook(http::WebhookScheme::kStandard, kSecret, id, now_s, d.body);
        for (const auto& [name, value] : *h) d.headers.emplace(name, value);
        deliveries.push_back(std::move(d));
      }
      const PostedAll firsts = PostAll(port, "/" + side, deliveries, static_cast<int>(*senders), 200, cmd);
      const PostedAll replays = PostAll(port, "/" + side, deliveries, static_cast<int>(*senders), 200, cmd);
      auto rows = Rows(**store, side == "idem" ? "bench_webhook_events" : "bench_webhook_events_redis", prefix);
      if (firsts.unexpected || replays.unexpected || !rows.ok() || *rows != *events) {
        std::fprintf(stderr,
                     "idem bench webhooks: %s round %lld: %lld and %lld answers not 200, %s rows for %lld events\n",
                     side.c_str(), static_cast<long long>(round), static_cast<long long>(firsts.unexpected),
                     static_cast<long long>(replays.unexpected),
                     rows.ok() ? std::to_string(*rows).c_str() : rows.status().ToString().c_str(),
                     static_cast<long long>(*events));
        rc = kExitCheckFailed;
        break;
      }
      const double first_ps = static_cast<double>(*events) / firsts.seconds,
                   replay_ps = static_cast<double>(*events) / replays.seconds;
      if (round == 0) continue;
      first[side].push_back(first_ps);
      replay[side].push_back(replay_ps);
      rounds_json.push_back(
          {{"round", round}, {"side", side}, {"first_per_s", first_ps}, {"replays_per_s", replay_ps}});
      if (!json)
        std::printf("%-6lld %-6s %14.0f %14.0f\n", static_cast<long long>(round), side.c_str(), first_ps, replay_ps);
      std::fflush(stdout);
    }
  }
  server.stop();
  serving.join();
  if (rc != kExitOk) return rc;
  const http::WebhookCounters c = (*receiver)->counters();
  const double first_ratio = Median(first["idem"]) / Median(first["redis"]);
  const double replay_ratio = Median(replay["idem"]) / Median(replay["redis"]);
  const double per_group = c.group_commits ? static_cast<double>(c.grouped) / static_cast<double>(c.group_commits) : 1;
  if (json) {
    nlohmann::json out = {
        {"events", *events},
        {"senders", *senders},
        {"group_commit", *group},
        {"rounds", rounds_json},
        {"median_first_per_s", {{"idem", Median(first["idem"])}, {"redis", Median(first["redis"])}}},
        {"median_replays_per_s", {{"idem", Median(replay["idem"])}, {"redis", Median(replay["redis"])}}},
        {"ratio_first", first_ratio},
        {"ratio_replays", replay_ratio},
        {"deliveries_per_group", per_group}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("median first deliveries/s: idem %.0f, redis %.0f: ratio idem/redis %.2fx\n", Median(first["idem"]),
                Median(first["redis"]), first_ratio);
    std::printf("median replays/s:          idem %.0f, redis %.0f: ratio idem/redis %.2fx\n", Median(replay["idem"]),
                Median(replay["redis"]), replay_ratio);
    std::printf("idem: %.1f deliveries per group commit\n", per_group);
  }
  return kExitOk;
}

}  // namespace idem::cli
