// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "provider_server.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <vector>

#include "charge.h"
#include "cli.h"
#include "idem/claims.h"
#include "idem/httplib/middleware.h"
#include "idem/httplib/server.h"

namespace idem::cli {
namespace {

constexpr const char* kCreateCharges =
    "CREATE TABLE IF NOT EXISTS provider_charges(id TEXT PRIMARY KEY, principal TEXT NOT NULL,"
    " idem_key TEXT NOT NULL, amount BIGINT NOT NULL, currency TEXT NOT NULL, customer TEXT NOT NULL,"
    " description TEXT NOT NULL, created_ms BIGINT NOT NULL, UNIQUE (principal, idem_key))";
// On SQLite the rows live in the id's B-tree itself (no rowid table beside
// an index on id): one B-tree less to write per charge. A table made by an
// earlier version keeps its layout; both answer the same queries.
constexpr const char* kSqliteWithoutRowid = " WITHOUT ROWID";
constexpr const char* kCreateByCustomer =
    "CREATE INDEX IF NOT EXISTS provider_charges_by_customer ON provider_charges(principal, customer)";
// A retry that took an expired lease over finds the charge the first try
// made: the unique (principal, key) makes the charge once either way.
constexpr const char* kInsertCharge =
    "INSERT INTO provider_charges(id, principal, idem_key, amount, currency, customer, description, created_ms)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (principal, idem_key) DO NOTHING"
    " RETURNING id, idem_key, amount, currency, customer, description, created_ms";
constexpr const char* kColumns = "SELECT id, idem_key, amount, currency, customer, description, created_ms";
// In the route's own transaction (--one-transaction) the key's claim and its
// charge commit together, so a new claim has no charge yet: the row goes in
// later (Transaction::InsertLater), with the other charges of its group in
// one statement. A charge already there for the key (a database a
// two-phase provider left mid-request) fails the insert, and the request
// answers 503, rather than name a charge that was not made.
constexpr const char* kInsertChargeLater =
    "INSERT INTO provider_charges(id, principal, idem_key, amount, currency, customer, description, created_ms)"
    " VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

// `s` as a JSON string, escaped as nlohmann::json::dump escapes it (the
// text came through nlohmann's parser, so it is valid UTF-8).
void AppendJsonString(std::string& out, std::string_view s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          static constexpr char kHex[] = "0123456789abcdef";
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xf];
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

// A charge row (kColumns) as the JSON the API answers: the bytes
// nlohmann::json would write for it (keys sorted, no spaces), without
// building a JSON tree on the committer's thread for every charge.
void AppendChargeJson(std::string& out, const std::vector<Value>& r) {
  out += "{\"amount\":" + std::to_string(r[2].AsInt()) + ",\"created\":" + std::to_string(r[6].AsInt() / 1000) +
         ",\"currency\":";
  AppendJsonString(out, r[3].AsText());
  out += ",\"customer\":";
  AppendJsonString(out, r[4].AsText());
  out += ",\"description\":";
  AppendJsonString(out, r[5].AsText());
  out += ",\"id\":";
  AppendJsonString(out, r[0].AsText());
  out += ",\"idempotency_key\":";
  AppendJsonString(out, r[1].AsText());
  out += ",\"object\":\"charge\"}";
}
std::string ChargeJson(const std::vector<Value>& r) {
  std::string out;
  AppendChargeJson(out, r);
  return out;
}

// A charge row (kColumns) as Stripe's API writes a charge object, for the
// /v1 routes that Stripe's own client libraries call.
nlohmann::json StripeCharge(const std::vector<Value>& r) {
  auto or_null = [](const std::string& s) { return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s); };
  return {{"id", r[0].AsText()},
          {"object", "charge"},
          {"amount", r[2].AsInt()},
          {"amount_captured", r[2].AsInt()},
          {"amount_refunded", 0},
          {"captured", true},
          {"created", r[6].AsInt() / 1000},
          {"currency", r[3].AsText()},
          {"customer", or_null(r[4].AsText())},
          {"description", or_null(r[5].AsText())},
          {"livemode", false},
          {"metadata", nlohmann::json::object()},
          {"paid", true},
          {"refunded", false},
          {"status", "succeeded"}};
}

// An error in Stripe's shape ({"error":{...}}), for the /v1 routes.
void StripeError(::httplib::Response& res, int status, const std::string& type, const std::string& message,
                 const std::string& param = "", const std::string& code = "") {
  nlohmann::json error = {{"type", type}, {"message", message}};
  if (!param.empty()) error["param"] = param;
  if (!code.empty()) error["code"] = code;
  res.status = status;
  res.set_header("Stripe-Should-Retry", status >= 500 ? "true" : "false");
  res.set_content(nlohmann::json{{"error", std::move(error)}}.dump(), "application/json");
}

// The provider's own problems (outside the middleware), in the middleware's
// shape: a title per type, and whether a retry can help.
void Problem(::httplib::Response& res, int status, const std::string& type, const std::string& detail) {
  static const std::map<std::string, std::pair<const char*, const char*>> kKinds = {
      {"invalid-request", {"Invalid request", "new-key"}},
      {"unauthenticated", {"Unauthenticated", "no"}},
      {"not-found", {"Not found", "no"}},
      {"store-unavailable", {"Store unavailable", "same-key"}},
      {"internal", {"Internal error", "no"}}};
  auto kind = kKinds.find(type);
  nlohmann::json j = {{"type", "https://idem.dev/problems/" + type},
                      {"title", kind != kKinds.end() ? kind->second.first : type.c_str()},
                      {"status", status},
                      {"detail", detail},
                      {"retry", kind != kKinds.end() ? kind->second.second : "no"}};
  res.status = status;
  res.set_content(j.dump(), "application/problem+json");
}

// A charge's fields, read from the body of POST /charges; nullopt (with a
// 400 problem in `res`) when they are not valid.
std::optional<ChargeFields> ReadCharge(const ::httplib::Request& req, ::httplib::Response& res) {
  Result<ChargeFields> charge = ParseCharge(req.body);
  if (!charge.ok()) {
    Problem(res, 400, "invalid-request", charge.status().message());
    return std::nullopt;
  }
  return std::move(*charge);
}

// The same for POST /v1/charges (a form body), with Stripe's error.
std::optional<ChargeFields> ReadStripeCharge(const ::httplib::Request& req, ::httplib::Response& res) {
  std::string param;
  Result<ChargeFields> charge = ParseStripeCharge(req.body, &param);
  if (!charge.ok()) {
    StripeError(res, 400, "invalid_request_error", charge.status().message(), param, "parameter_invalid");
    return std::nullopt;
  }
  return std::move(*charge);
}

// The two dialects of the charges API.
enum class Dialect {
  kJson,    // POST /charges: JSON in, 201 and the charge out, problem+json errors
  kStripe,  // POST /v1/charges: form in, 200 and a Stripe charge object out, Stripe's errors
};

}  // namespace

struct ProviderServer::Impl {
  ProviderServerOptions options;
  std::shared_ptr<Store> store;
  std::unique_ptr<Claims> claims;
  std::unique_ptr<http::Idempotency> idempotency;
  http::Authenticator authenticate;
  std::unique_ptr<idem::httplib::Server> own_server;  // cpp-httplib's, one recv and one send per request
  ::httplib::Server& server() { return own_server->native(); }
  std::thread thread;
  // Responses to drop (options.lose_response), by principal and key: the
  // handler decides (on a committer's thread under group commit), the
  // server's thread drops the answer after routing.
  std::mutex drop_mu;
  std::set<std::pair<std::string, std::string>> drop;
  int port = 0;
  socket_t listen_fd = INVALID_SOCKET;

  // In its own transaction (two-phase routes) or in `outer`, the route's
  // transaction that also holds the key's record.
  Status Charge(Dialect dialect, const ::httplib::Request& req, ::httplib::Response& res, Transaction* outer) {
    const bool stripe = dialect == Dialect::kStripe;
    const ClaimToken* claim = http::CurrentClaim();
    auto principal = authenticate(idem::httplib::ToRequest(req));
    // POST /v1/charges takes requests without a key, as Stripe does (each
    // one a new charge); POST /charges never lets one through.
    if ((claim == nullptr && !stripe) || !principal) {
      Problem(res, 500, "internal", "POST /charges ran outside the idempotency middleware");
      return Status::OK();
    }
    // Checked before the claim too (RoutePolicy::validate); read again here
    // for the fields.
    std::optional<ChargeFields> charge = stripe ? ReadStripeCharge(req, res) : ReadCharge(req, res);
    if (!charge) return Status::OK();
    if (options.before_charge && claim != nullptr) options.before_charge(claim->key);
    if (options.charge_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(options.charge_delay_ms));
    // Time first, then 48 random bits: ids are unique and sort by creation,
    // so each new charge lands at the end of the id index instead of on a
    // page of its own (fewer pages written per commit).
    char id[32];
    std::snprintf(id, sizeof id, "ch_%012llx%012llx", static_cast<unsigned long long>(Env::Default()->NowMs()),
                  static_cast<unsigned long long>(Env::Default()->Random() & 0xffffffffffffULL));
    std::unique_ptr<StoreTransaction> own;
    if (outer == nullptr) {
      IDEM_ASSIGN_OR_RETURN(own, store->BeginDeferred());  // BEGIN goes with the insert where the store can
    }
    Transaction* tx = outer != nullptr ? outer : own.get();
    // Unique per (principal, key); a charge made without a key is keyed by
    // its own id.
    const std::string key = claim != nullptr ? claim->key : "none:" + std::string(id);
    Value ins[] = {std::string(id),
                   *principal,
                   key,
                   charge->amount,
                   charge->currency,
                   charge->customer,
                   charge->description,
                   Env::Default()->NowMs()};
    Rows rows;
    if (outer != nullptr && claim != nullptr) {
      IDEM_RETURN_IF_ERROR(outer->InsertLater(kInsertChargeLater, ins));
      rows.rows.push_back({ins[0], ins[2], ins[3], ins[4], ins[5], ins[6], ins[7]});  // kColumns' order
    } else {
      IDEM_ASSIGN_OR_RETURN(rows, tx->Query(kInsertCharge, ins));
    }
    if (rows.rows.empty()) {  // made by an earlier holder of the key (a takeover): that one counts
      Value p[] = {*principal, key};
      IDEM_ASSIGN_OR_RETURN(
          rows, tx->Query(std::string(kColumns) + " FROM provider_charges WHERE principal = $1 AND idem_key = $2", p));
    }
    if (own != nullptr) IDEM_RETURN_IF_ERROR(own->Commit());
    if (rows.rows.empty()) return Status::Internal("the charge just written is not there");
    if (stripe) {
      res.status = 200;  // Stripe answers a created object 200
      res.set_content(StripeCharge(rows.rows[0]).dump(), "application/json");
    } else {
      res.status = 201;
      res.set_header("Location", "/charges/" + rows.rows[0][0].AsText());
      res.set_content(ChargeJson(rows.rows[0]), "application/json");
    }
    if (claim != nullptr && options.lose_response && options.lose_response(claim->key)) {
      std::lock_guard lock(drop_mu);
      drop.emplace(*principal, claim->key);
    }
    return Status::OK();
  }

  // The charges (kColumns) that `where` selects, in a transaction of their own.
  Result<Rows> Select(const std::string& where, const std::vector<Value>& params) {
    IDEM_ASSIGN_OR_RETURN(auto tx, store->BeginDeferred());
    return tx->Query(std::string(kColumns) + " FROM provider_charges WHERE " + where, params);
  }
  // GET /charges/{id} (one), or the principal's charges.
  Result<Rows> SelectOneOrList(const std::string& principal, const ::httplib::Request& req, bool one) {
    if (one) return Select("principal = $1 AND id = $2", {principal, req.matches[1].str()});
    return Select("principal = $1 AND ($2 = '' OR customer = $2) ORDER BY created_ms, id LIMIT 1000",
                  {principal, req.get_param_value("customer")});
  }

  void Read(const ::httplib::Request& req, ::httplib::Response& res, bool one) {
    auto principal = authenticate(idem::httplib::ToRequest(req));
    if (!principal) return Problem(res, 401, "unauthenticated", "send Authorization: Bearer <API key>");
    Result<Rows> rows = SelectOneOrList(*principal, req, one);
    if (!rows.ok()) return Problem(res, 503, "store-unavailable", rows.status().ToString());
    if (one) {
      if (rows->rows.empty()) return Problem(res, 404, "not-found", "no charge " + req.matches[1].str());
      res.set_content(ChargeJson(rows->rows[0]), "application/json");
      return;
    }
    std::string list = "{\"data\":[";
    for (size_t i = 0; i < rows->rows.size(); ++i) {
      if (i > 0) list += ',';
      AppendChargeJson(list, rows->rows[i]);
    }
    list += "],\"object\":\"list\"}";
    res.set_content(list, "application/json");
  }

  // GET /v1/charges/{id} and GET /v1/charges (newest first; limit 1..100,
  // default 10; starting_after; customer), as Stripe answers them.
  void ReadStripe(const ::httplib::Request& req, ::httplib::Response& res, bool one) {
    auto principal = authenticate(idem::httplib::ToRequest(req));
    if (!principal)
      return StripeError(res, 401, "invalid_request_error",
                         "Invalid API Key provided: send Authorization: Bearer <API key>");
    int64_t limit = 10;
    if (!one && req.has_param("limit")) {
      const std::string v = req.get_param_value("limit");
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), limit);
      if (v.empty() || ec != std::errc() || end != v.data() + v.size() || limit < 1 || limit > 100)
        return StripeError(res, 400, "invalid_request_error", "Invalid integer: limit must be from 1 to 100", "limit");
    }
    // Ids begin with their creation time (fixed width): newest first is id
    // order, and starting_after an id is "id < it".
    Result<Rows> rows =
        one ? SelectOneOrList(*principal, req, true)
            : Select(
                  "principal = $1 AND ($2 = '' OR customer = $2) AND ($3 = '' OR id < $3)"
                  " ORDER BY id DESC LIMIT $4",
                  {*principal, req.get_param_value("customer"), req.get_param_value("starting_after"), limit + 1});
    if (!rows.ok()) return StripeError(res, 503, "api_error", rows.status().ToString());
    if (one) {
      if (rows->rows.empty())
        return StripeError(res, 404, "invalid_request_error", "No such charge: '" + req.matches[1].str() + "'", "id",
                           "resource_missing");
      res.set_content(StripeCharge(rows->rows[0]).dump(), "application/json");
      return;
    }
    const bool more = static_cast<int64_t>(rows->rows.size()) > limit;
    nlohmann::json data = nlohmann::json::array();
    for (size_t i = 0; i < rows->rows.size() && static_cast<int64_t>(i) < limit; ++i)
      data.push_back(StripeCharge(rows->rows[i]));
    res.set_content(
        nlohmann::json{{"object", "list"}, {"data", std::move(data)}, {"has_more", more}, {"url", "/v1/charges"}}
            .dump(),
        "application/json");
  }
  // The steps of ProviderServer::Start, in order.

  // The store with the charges table, the claims and the Idempotency-Key
  // middleware.
  Status OpenStoreAndMiddleware() {
    Impl* p = this;
    // Every server thread may hold a connection (two while it claims).
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<Store> store,
                          OpenStore(p->options.store_url, true, 2 * std::max(1, p->options.threads)));
    p->store = std::move(store);
    if (p->store->claim_store() == nullptr) return Status::InvalidArgument("the provider's store keeps no claims");
    {
      IDEM_ASSIGN_OR_RETURN(auto tx, p->store->Begin());
      const bool sqlite = p->store->Kind() == "sqlite";
      IDEM_RETURN_IF_ERROR(tx->Exec(std::string(kCreateCharges) + (sqlite ? kSqliteWithoutRowid : "")).status());
      IDEM_RETURN_IF_ERROR(tx->Exec(kCreateByCustomer).status());
      IDEM_RETURN_IF_ERROR(tx->Commit());
    }
    IDEM_ASSIGN_OR_RETURN(
        p->claims, Claims::Open(*p->store->claim_store(), Claims::Options{.retention_ms = p->options.retention_ms}));
    p->authenticate = http::BearerKeys(p->options.api_keys);
    http::Idempotency::Options idempotency = p->options.idempotency;
    idempotency.claims = p->claims.get();
    idempotency.authenticate = p->authenticate;
    idempotency.log = p->options.log;
    IDEM_ASSIGN_OR_RETURN(p->idempotency, http::Idempotency::Open(idempotency));
    return Status::OK();
  }

  // The HTTP server and its connection settings.
  Status OpenServer() {
    Impl* p = this;
    IDEM_ASSIGN_OR_RETURN(
        p->own_server, idem::httplib::Server::Open({.request_deadline_ms = p->options.request_deadline_ms,
                                                    .max_connections = p->options.max_connections,
                                                    .max_connections_per_client = p->options.max_connections_per_client,
                                                    .threads = std::max(1, p->options.threads),
                                                    .keep_alive_requests = 100'000,
                                                    .fibers = p->options.fibers}));
    // Without it a small response waits for the client's delayed ACK (~40 ms).
    p->server().set_tcp_nodelay(true);
    p->server().set_keep_alive_timeout(30);
    // A body past the limit is refused before it is read (cpp-httplib answers
    // 413 from the Content-Length), so no client can make the provider hold it.
    p->server().set_payload_max_length(p->options.idempotency.max_body_bytes);
    p->server().set_error_handler(
        [base = p->options.idempotency.problem_base, limit = p->options.idempotency.max_body_bytes](
            const ::httplib::Request&, ::httplib::Response& res) {
          if (res.status != 413 || !res.body.empty()) return;
          res.set_content(nlohmann::json{{"type", base + "/body-too-large"},
                                         {"title", "Request body too large"},
                                         {"status", 413},
                                         {"detail", "the body is larger than " + std::to_string(limit) + " bytes"},
                                         {"retry", "new-key"}}
                              .dump(),
                          "application/problem+json");
        });
    return Status::OK();
  }

  Status RouteCharges() {
    Impl* p = this;
    // A body that is not a valid charge is refused before its key is claimed
    // (nothing stored; under group commit it never joins a group).
    const http::RoutePolicy policy{.wait_ms = p->options.wait_ms, .lease_ms = p->options.lease_ms};
    // POST /charges (JSON) and POST /v1/charges (Stripe's dialect: form
    // bodies, a key optional, Stripe's error shape), each its own route.
    for (const Dialect dialect : {Dialect::kJson, Dialect::kStripe}) {
      const bool stripe = dialect == Dialect::kStripe;
      http::RoutePolicy route_policy = policy;
      if (stripe) {
        route_policy.require_key = false;
        route_policy.refusals = http::StripeErrors();
      }
      const idem::httplib::Validator validate = [stripe](const ::httplib::Request& req, ::httplib::Response& res) {
        return (stripe ? ReadStripeCharge(req, res) : ReadCharge(req, res)).has_value();
      };
      auto charge = [p, dialect, stripe](const ::httplib::Request& req, ::httplib::Response& res, Transaction* tx) {
        if (Status s = p->Charge(dialect, req, res, tx); !s.ok()) {  // 5xx: released (rolled back), retried
          res = ::httplib::Response();
          if (stripe)
            StripeError(res, 503, "api_error", s.ToString());
          else
            Problem(res, 503, "store-unavailable", s.ToString());
        }
      };
      const std::string path = stripe ? "/v1/charges" : "/charges";
      Result<idem::httplib::Handler> post_charges = Status::Internal("no route");
      if (p->options.one_transaction) {
        post_charges = idem::httplib::WrapInTransaction(
            *p->idempotency, path, route_policy, *p->store,
            [charge](const ::httplib::Request& req, ::httplib::Response& res, Transaction& tx) {
              charge(req, res, &tx);
            },
            validate);
      } else {
        post_charges = idem::httplib::Wrap(
            *p->idempotency, path, route_policy,
            [charge](const ::httplib::Request& req, ::httplib::Response& res) { charge(req, res, nullptr); }, validate);
      }
      if (!post_charges.ok()) return post_charges.status();
      p->server().Post(path, std::move(*post_charges));
    }
    return Status::OK();
  }

  void RouteReads() {
    Impl* p = this;
    p->server().Get(R"(/v1/charges/([A-Za-z0-9_]+))",
                    [p](const ::httplib::Request& req, ::httplib::Response& res) { p->ReadStripe(req, res, true); });
    p->server().Get("/v1/charges",
                    [p](const ::httplib::Request& req, ::httplib::Response& res) { p->ReadStripe(req, res, false); });
    p->server().Get(R"(/charges/([A-Za-z0-9_]+))",
                    [p](const ::httplib::Request& req, ::httplib::Response& res) { p->Read(req, res, true); });
    p->server().Get("/charges",
                    [p](const ::httplib::Request& req, ::httplib::Response& res) { p->Read(req, res, false); });
    p->server().Get("/health", [](const ::httplib::Request&, ::httplib::Response& res) {
      res.set_content("healthy", "text/plain");
    });
  }

  void RouteMetrics() {
    Impl* p = this;
    // Prometheus text format, without authentication (the provider listens on
    // loopback by default): what the Idempotency-Key middleware did, and how
    // long its requests took by outcome.
    p->server().Get("/metrics", [p](const ::httplib::Request&, ::httplib::Response& res) {
      // The middleware's counters and request-latency histograms, then the server's.
      std::string out = p->idempotency->Metrics();
      const idem::httplib::Server::Counters s = p->own_server->counters();
      AppendMetric(out, "idem_http_connections_refused_total",
                   "Connections answered 503 over the open-connection bounds (in all, per client address).", "counter",
                   "", s.refused);
      AppendMetric(out, "idem_http_deadline_closes_total",
                   "Connections closed because a request's head and body did not arrive within the deadline.",
                   "counter", "", s.deadline_closes);
      AppendMetric(out, "idem_http_connections_open", "Connections open now.", "gauge", "", s.open);
      res.set_content(out, "text/plain; version=0.0.4");
    });
  }

  void LoseResponses() {
    Impl* p = this;
    // A lost response: the charge and its stored response are kept; the
    // client sees the connection end before a complete answer.
    p->server().set_post_routing_handler([p](const ::httplib::Request& req, ::httplib::Response& res) {
      if (!p->options.lose_response || res.status / 100 != 2 || res.has_header("Idempotent-Replayed") ||
          !req.has_header("Idempotency-Key"))
        return;
      auto principal = p->authenticate(idem::httplib::ToRequest(req));
      auto key = http::ParseKey(req.get_header_value("Idempotency-Key"));
      if (!principal || !key.ok()) return;
      {
        std::lock_guard lock(p->drop_mu);
        if (p->drop.erase({*principal, *key}) == 0) return;
      }
      const size_t length = res.body.size() + 1;
      // cpp-httplib writes a non-empty body and ignores the content provider:
      // without this the "lost" response would arrive complete.
      res.body.clear();
      res.set_content_provider(length, "application/json", [](size_t, size_t, ::httplib::DataSink&) { return false; });
    });
  }

  // Binds the port and starts the accept loop.
  Status Listen() {
    Impl* p = this;
    // cpp-httplib's default sets SO_REUSEPORT: a second server on a port in
    // use would share it (and its requests) instead of failing. SO_REUSEADDR
    // only (a restart may still bind over TIME_WAIT).
    p->server().set_socket_options([p](socket_t sock) {
      int yes = 1;
      setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
      p->listen_fd = sock;
    });
    if (p->options.port == 0) {
      p->port = p->server().bind_to_any_port(p->options.host);
      if (p->port <= 0) return Status::Unavailable("cannot bind " + p->options.host + " to any port");
    } else {
      if (!p->server().bind_to_port(p->options.host, p->options.port))
        return Status::Unavailable("cannot listen on " + p->options.host + ":" + std::to_string(p->options.port) +
                                   " (in use, or not an address of this machine)");
      p->port = p->options.port;
    }
    // cpp-httplib 0.11 listens with a backlog of 5: a burst of clients (more
    // than 5 connecting at once) gets connections reset. Listening again on the
    // bound socket raises it.
    if (p->listen_fd != INVALID_SOCKET) ::listen(p->listen_fd, SOMAXCONN);
    auto ended = std::make_shared<std::atomic<bool>>(false);
    p->thread = std::thread([p, ended] {
      p->server().listen_after_bind();
      ended->store(true);
    });
    // Connections are accepted from the bind on (the listen backlog); this
    // only waits for the accept loop, so Stop() right after cannot miss it.
    while (!p->server().is_running() && !ended->load()) std::this_thread::yield();
    if (ended->load()) {
      p->thread.join();
      return Status::Unavailable("the server on " + p->options.host + " stopped at once");
    }
    return Status::OK();
  }
};

ProviderServer::ProviderServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProviderServer::~ProviderServer() { Stop(); }

Result<std::unique_ptr<ProviderServer>> ProviderServer::Start(ProviderServerOptions options) {
  if (options.api_keys.empty()) return Status::InvalidArgument("no API keys: give --api-key KEY:PRINCIPAL");
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  IDEM_RETURN_IF_ERROR(impl->OpenStoreAndMiddleware());
  IDEM_RETURN_IF_ERROR(impl->OpenServer());
  IDEM_RETURN_IF_ERROR(impl->RouteCharges());
  impl->RouteReads();
  impl->RouteMetrics();
  impl->LoseResponses();
  IDEM_RETURN_IF_ERROR(impl->Listen());
  return std::unique_ptr<ProviderServer>(new ProviderServer(std::move(impl)));
}

int ProviderServer::port() const { return impl_->port; }
std::string ProviderServer::url() const { return "http://" + impl_->options.host + ":" + std::to_string(impl_->port); }
void ProviderServer::Stop() {
  if (!impl_) return;
  impl_->server().stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}
void ProviderServer::Wait() {
  if (impl_->thread.joinable()) impl_->thread.join();
}
http::Idempotency::Counters ProviderServer::counters() const { return impl_->idempotency->counters(); }
idem::httplib::Server::Counters ProviderServer::server_counters() const { return impl_->own_server->counters(); }

Result<std::map<std::string, std::string>> ParseApiKeys(const std::vector<std::string>& pairs,
                                                        const std::string& file) {
  std::map<std::string, std::string> keys;
  auto add = [&](const std::string& pair, const std::string& where) -> Status {
    auto colon = pair.find(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == pair.size())
      return Status::InvalidArgument(where + ": expected KEY:PRINCIPAL, got '" + pair.substr(0, 8) + "...'");
    // A key is the secret: print its first characters only.
    if (!keys.emplace(pair.substr(0, colon), pair.substr(colon + 1)).second)
      return Status::InvalidArgument(where + ": the API key '" + pair.substr(0, std::min<size_t>(colon, 4)) +
                                     "...' is given twice (one key, one principal)");
    return Status::OK();
  };
  for (const auto& p : pairs) IDEM_RETURN_IF_ERROR(add(p, "--api-key"));
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) return Status::InvalidArgument("cannot read the API key file " + file);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
      if (line.empty() || line[0] == '#') continue;
      IDEM_RETURN_IF_ERROR(add(line, file + ":" + std::to_string(n)));
    }
  }
  return keys;
}

}  // namespace idem::cli
