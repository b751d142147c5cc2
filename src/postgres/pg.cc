// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "postgres/pg.h"

#include "idem/postgres/store.h"

#include "core/kill_point.h"
#include "idem/env.h"
#include "idem/url.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace idem::pg_internal {
namespace {

// Type OIDs from pg_type.h (stable across versions).
constexpr Oid kBoolOid = 16, kByteaOid = 17, kInt8Oid = 20, kInt2Oid = 21, kInt4Oid = 23, kOidOid = 26,
              kFloat4Oid = 700, kFloat8Oid = 701, kNumericOid = 1700;

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

}  // namespace

Code CodeForSqlState(std::string_view st) {
  if (st.size() != 5) return Code::kUnavailable;  // no SQLSTATE: the connection failed
  if (st == "23505") return Code::kDuplicate;
  if (st == "40001" || st == "40P01") return Code::kRetryable;  // serialization failure, deadlock
  if (st == "55P03") return Code::kBusy;                        // lock not available
  if (st == "57014") return Code::kAborted;                     // query canceled
  if (st == "25P02") return Code::kAborted;                     // in failed transaction
  if (st == "53300") return Code::kUnavailable;                 // too many connections
  if (st == "3D000") return Code::kUnavailable;                 // database does not exist
  if (st == "XX001" || st == "XX002") return Code::kCorruption;
  std::string_view cls = st.substr(0, 2);
  if (cls == "08") return Code::kUnavailable;  // connection exception
  if (cls == "57") return Code::kUnavailable;  // operator intervention: admin shutdown, crash
  if (cls == "28") return Code::kUnavailable;  // invalid authorization
  if (cls == "53") return Code::kRetryable;    // insufficient resources
  if (cls == "58") return Code::kIoError;      // system error
  if (cls == "40") return Code::kRetryable;
  if (cls == "22" || cls == "23" || cls == "42" || cls == "0A" || cls == "2B" || cls == "21")
    return Code::kInvalidArgument;
  if (cls == "XX") return Code::kInternal;
  return Code::kInternal;
}

Status Translate(const PGresult* res, PGconn* conn, std::string_view what) {
  if (res != nullptr) {
    ExecStatusType st = PQresultStatus(res);
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK || st == PGRES_SINGLE_TUPLE || st == PGRES_EMPTY_QUERY)
      return Status::OK();
  }
  const char* state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : nullptr;
  std::string m(what);
  m += ": ";
  std::string detail = res ? PQresultErrorMessage(res) : "";
  if (detail.empty() && conn != nullptr) detail = PQerrorMessage(conn);
  if (detail.empty()) detail = "no result from the server";
  m += Trim(detail);
  if (state != nullptr) {
    m += " (SQLSTATE ";
    m += state;
    m += ")";
  }
  Code code = CodeForSqlState(state ? state : "");
  if (state == nullptr && conn != nullptr && PQstatus(conn) == CONNECTION_BAD) {
    code = Code::kUnavailable;
    m += " (connection lost)";
  }
  return Status(code, std::move(m));
}

Result<std::unique_ptr<Conn>> Conn::Connect(const std::string& conninfo, int64_t connect_timeout_ms) {
  // A URL libpq cannot parse is the caller's mistake, named without its
  // password (libpq's message may quote the whole URL).
  const auto redacted = [&](std::string text) {
    const std::string safe = RedactUrl(conninfo);
    if (!conninfo.empty())
      for (size_t at = text.find(conninfo); at != std::string::npos; at = text.find(conninfo, at + safe.size()))
        text.replace(at, conninfo.size(), safe);
    return Trim(text);
  };
  if (!conninfo.empty()) {
    char* err = nullptr;
    PQconninfoOption* parsed = PQconninfoParse(conninfo.c_str(), &err);
    if (parsed == nullptr) {
      std::string why = err != nullptr ? redacted(err) : "out of memory";
      PQfreemem(err);
      return Status::InvalidArgument("not a valid PostgreSQL URL: " + RedactUrl(conninfo) + ": " + why);
    }
    PQconninfoFree(parsed);
  }
  // libpq counts whole seconds: round up.
  std::string timeout = std::to_string(connect_timeout_ms > 0 ? (connect_timeout_ms + 999) / 1000 : 5);
  // Expand the URL or key=value string, then add our defaults for anything
  // it does not set (a URL's own connect_timeout wins).
  const char* keys[] = {"dbname", "connect_timeout", "application_name", nullptr};
  const char* vals[] = {conninfo.c_str(), timeout.c_str(), "idem", nullptr};
  PGconn* c = PQconnectdbParams(keys, vals, /*expand_dbname=*/1);
  std::unique_ptr<Conn> conn(new Conn(c));
  if (c == nullptr) return Status::Unavailable("PostgreSQL: out of memory creating a connection");
  if (PQstatus(c) != CONNECTION_OK) {
    // Never echo a password back.
    std::string where = conninfo.empty() ? "(PG* environment)" : RedactUrl(conninfo);
    std::string why = redacted(PQerrorMessage(c));
    // A transaction pooler (pgbouncer) refuses startup settings.
    if (why.find("unsupported startup parameter") != std::string::npos)
      why +=
          " (a connection pooler refused a startup setting such as the URL's options=-c...: behind a pooler, "
          "set it per role instead, ALTER ROLE ... SET ...)";
    return Status::Unavailable("cannot connect to PostgreSQL at " + where + ": " + why);
  }
  // Notices (e.g. "relation already exists, skipping") are not for stderr.
  PQsetNoticeProcessor(
      c, [](void*, const char*) {}, nullptr);
  return conn;
}

Conn::~Conn() {
  if (conn_ != nullptr) PQfinish(conn_);
}

bool Conn::in_transaction() const {
  PGTransactionStatusType t = PQtransactionStatus(conn_);
  return t == PQTRANS_INTRANS || t == PQTRANS_INERROR || t == PQTRANS_ACTIVE;
}

Status Conn::Script(std::string_view sql) {
  IDEM_KILL_POINT("postgres.round_trip");
  std::string s(sql);
  ResultPtr r(PQexec(conn_, s.c_str()));
  return Translate(r.get(), conn_, s.size() > 80 ? s.substr(0, 80) + "..." : s);
}

// Parameters in libpq's form; the pointers point into `text` or the Values.
struct Encoded {
  int n = 0;
  std::vector<Oid> types;
  std::vector<std::string> text;
  std::vector<const char*> values;
  std::vector<int> lengths, formats;
  std::string sig;  // one letter per parameter kind: statements are prepared per (SQL, kinds)
};

namespace {

Result<Encoded> Encode(std::span<const Value> params) {
  Encoded e;
  e.n = static_cast<int>(params.size());
  e.types.assign(e.n, 0);
  e.text.resize(e.n);
  e.values.assign(e.n, nullptr);
  e.lengths.assign(e.n, 0);
  e.formats.assign(e.n, 0);
  for (int i = 0; i < e.n; ++i) {
    const auto& v = params[i].raw();
    if (std::holds_alternative<std::monostate>(v)) {
      e.sig += 'n';
    } else if (auto* x = std::get_if<int64_t>(&v)) {
      e.types[i] = kInt8Oid;
      e.text[i] = std::to_string(*x);
      e.values[i] = e.text[i].c_str();
      e.sig += 'i';
    } else if (auto* d = std::get_if<double>(&v)) {
      e.types[i] = kFloat8Oid;
      char buf[40];
      std::snprintf(buf, sizeof buf, "%.17g", *d);
      e.text[i] = buf;
      e.values[i] = e.text[i].c_str();
      e.sig += 'd';
    } else if (auto* s = std::get_if<std::string>(&v)) {
      if (s->find('\0') != std::string::npos)
        return Status::InvalidArgument("parameter $" + std::to_string(i + 1) +
                                       " is text with a NUL byte; pass it as idem::Blob");
      e.values[i] = s->c_str();
      e.sig += 's';
    } else if (auto* b = std::get_if<Blob>(&v)) {
      e.types[i] = kByteaOid;
      e.values[i] = b->bytes.data();
      e.lengths[i] = static_cast<int>(b->bytes.size());
      e.formats[i] = 1;
      e.sig += 'b';
    }
  }
  return e;
}

std::string What(std::string_view sql) { return std::string(sql.substr(0, 120)); }

}  // namespace

namespace {

// A statement's name from its text and parameter kinds (FNV-1a, 64 bits):
// the same statement has the same name in every session, so a session that
// is not this connection's own (a pooler's, wrongly taken for a direct one)
// can never run another statement under it: its PREPARE fails instead.
std::string StatementName(std::string_view key) {
  uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ULL;
  char buf[24];
  std::snprintf(buf, sizeof buf, "idem_%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// A PREPARE that finds its name taken, or an execution that finds none: the
// server session changed under the connection, as behind a transaction
// pooler. Says so, where, and the fix (kUnavailable: the server as reached
// cannot serve what this connection needs; exit 3 from the CLI).
Status NameThePooler(Status s, PGconn* conn) {
  if (s.ok()) return s;
  const std::string& m = s.message();
  if (m.find("SQLSTATE 42P05") == std::string::npos && m.find("SQLSTATE 26000") == std::string::npos) return s;
  return Status::Unavailable("PostgreSQL at " + std::string(PQhost(conn)) + ":" + PQport(conn) + ": " + m +
                             ": the server session changed between statements, as behind a transaction pooler "
                             "(pgbouncer pool_mode=transaction): use ?idem_pooler=transaction (or auto) in the URL");
}

}  // namespace

Result<bool> Conn::BehindAPooler() {
  IDEM_KILL_POINT("postgres.round_trip");
  ResultPtr r(PQexec(conn_, "SELECT pg_backend_pid()"));
  IDEM_RETURN_IF_ERROR(Translate(r.get(), conn_, "SELECT pg_backend_pid()"));
  if (PQntuples(r.get()) != 1) return Status::Internal("SELECT pg_backend_pid() returned no row");
  return std::atoll(PQgetvalue(r.get(), 0, 0)) != PQbackendPID(conn_);
}

Conn::Prepared Conn::StatementFor(std::string_view sql, const Encoded& e) const {
  // Prepared once per (SQL, parameter kinds); NULLs match any kind.
  Prepared st;
  st.key = std::string(sql) + '\x1f' + e.sig;
  auto it = prepared_.find(st.key);
  st.prepare = it == prepared_.end();
  st.name = st.prepare ? StatementName(st.key) : it->second;
  return st;
}

Result<ResultPtr> Conn::Exec(std::string_view sql, std::span<const Value> params) {
  IDEM_ASSIGN_OR_RETURN(Encoded e, Encode(params));
  if (pooled_) {
    IDEM_KILL_POINT("postgres.round_trip");
    ResultPtr r(PQexecParams(conn_, std::string(sql).c_str(), e.n, e.types.data(), e.values.data(), e.lengths.data(),
                             e.formats.data(), 0));
    IDEM_RETURN_IF_ERROR(Translate(r.get(), conn_, What(sql)));
    return r;
  }
  const Prepared st = StatementFor(sql, e);
  if (st.prepare) {
    IDEM_KILL_POINT("postgres.round_trip");
    ResultPtr r(PQprepare(conn_, st.name.c_str(), std::string(sql).c_str(), e.n, e.types.data()));
    IDEM_RETURN_IF_ERROR(NameThePooler(Translate(r.get(), conn_, "prepare: " + What(sql)), conn_));
    prepared_.emplace(st.key, st.name);
  }
  IDEM_KILL_POINT("postgres.round_trip");
  ResultPtr r(PQexecPrepared(conn_, st.name.c_str(), e.n, e.values.data(), e.lengths.data(), e.formats.data(), 0));
  IDEM_RETURN_IF_ERROR(NameThePooler(Translate(r.get(), conn_, What(sql)), conn_));
  return r;
}

Result<std::vector<ResultPtr>> Conn::Flight(std::string_view first, std::span<const Step> steps) {
  if (PQenterPipelineMode(conn_) != 1)
    return Status::Unavailable("cannot enter pipeline mode: " + Trim(PQerrorMessage(conn_)));
  // Each step's prepared statement (per SQL and parameter kinds), with a
  // PREPARE in front of the first step that needs one not yet prepared.
  struct Planned {
    std::string key, name, text;
    bool prepare = false;
  };
  std::vector<Planned> plan(steps.size());
  std::unordered_map<std::string, std::string> fresh;  // prepared in this flight: key -> name
  for (size_t i = 0; i < steps.size(); ++i) {
    if (pooled_) {  // unnamed: nothing to prepare, nothing to remember
      plan[i] = Planned{{}, {}, std::string(steps[i].sql), false};
      continue;
    }
    Prepared st = StatementFor(steps[i].sql, *steps[i].params);
    if (st.prepare) {
      auto [it, added] = fresh.try_emplace(st.key, st.name);
      st.prepare = added;
    }
    plan[i] = Planned{std::move(st.key), std::move(st.name), std::string(steps[i].sql), st.prepare};
  }
  const std::string first_sql(first);
  // One flight: [`first`,] each step's [PREPARE and] execution, a sync.
  std::vector<std::string> what;  // per query, what it was (for errors)
  std::vector<size_t> exec_at;    // per step, the index of its execution's result
  IDEM_KILL_POINT("postgres.round_trip");
  bool sent = true;
  if (!first.empty()) {
    sent = PQsendQueryParams(conn_, first_sql.c_str(), 0, nullptr, nullptr, nullptr, nullptr, 0) == 1;
    what.push_back(first_sql);
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    const Encoded& e = *steps[i].params;
    if (plan[i].prepare) {
      sent = sent && PQsendPrepare(conn_, plan[i].name.c_str(), plan[i].text.c_str(), e.n, e.types.data()) == 1;
      what.push_back("prepare: " + What(plan[i].text));
    }
    if (pooled_) {
      sent = sent && PQsendQueryParams(conn_, plan[i].text.c_str(), e.n, e.types.data(), e.values.data(),
                                       e.lengths.data(), e.formats.data(), 0) == 1;
    } else {
      sent = sent && PQsendQueryPrepared(conn_, plan[i].name.c_str(), e.n, e.values.data(), e.lengths.data(),
                                         e.formats.data(), 0) == 1;
    }
    exec_at.push_back(what.size());
    what.push_back(What(plan[i].text));
  }
  sent = sent && PQpipelineSync(conn_) == 1;
  // Each query's result is followed by a NULL; the sync's result comes last.
  const size_t queries = what.size();
  std::vector<ResultPtr> got;
  bool synced = false;
  for (size_t nulls = 0; sent && PQstatus(conn_) == CONNECTION_OK;) {
    PGresult* r = PQgetResult(conn_);
    if (r == nullptr) {
      if (++nulls > queries) break;
      continue;
    }
    if (PQresultStatus(r) == PGRES_PIPELINE_SYNC) {
      PQclear(r);
      synced = true;
      break;
    }
    got.emplace_back(r);
  }
  // Without the sync the connection stays in pipeline mode: it then counts
  // as in a transaction, so it is never pooled again.
  if (synced) PQexitPipelineMode(conn_);
  // A PREPARE that succeeded stays on the server whatever came after it
  // (a failing execution, a rollback): the cache must know its name.
  for (size_t i = 0; i < steps.size(); ++i) {
    const size_t at = exec_at[i] - 1;
    if (plan[i].prepare && got.size() > at && PQresultStatus(got[at].get()) == PGRES_COMMAND_OK)
      prepared_.emplace(plan[i].key, plan[i].name);
  }
  for (size_t i = 0; i < queries; ++i) {
    // The first failure is the one to report: later queries only say the pipeline was aborted.
    if (i >= got.size()) return Translate(nullptr, conn_, what[i]);
    IDEM_RETURN_IF_ERROR(NameThePooler(Translate(got[i].get(), conn_, what[i]), conn_));
  }
  if (!synced) return Translate(nullptr, conn_, what.back());
  std::vector<ResultPtr> out;
  out.reserve(steps.size());
  for (size_t at : exec_at) out.push_back(std::move(got[at]));
  return out;
}

Result<std::vector<ResultPtr>> Conn::FlightOrAgain(std::string_view first, std::span<const Step> steps) {
  Result<std::vector<ResultPtr>> r = Flight(first, steps);
  if (r.ok() || first.empty() || healthy()) return r;
  // A pooled connection found dead (a server restart since its last use)
  // by the flight that begins the transaction: nothing of it can have
  // committed, so one more try on a fresh connection is safe.
  PQreset(conn_);
  prepared_.clear();
  if (!healthy()) return r;
  return Flight(first, steps);
}

Result<std::vector<ResultPtr>> Conn::ExecFlight(std::string_view first, std::span<const Statement> statements) {
  if (statements.empty()) return std::vector<ResultPtr>();
  std::vector<Encoded> encoded;
  encoded.reserve(statements.size());
  for (const Statement& st : statements) {
    IDEM_ASSIGN_OR_RETURN(Encoded e, Encode(st.params));
    encoded.push_back(std::move(e));
  }
  std::vector<Step> steps;
  steps.reserve(encoded.size());
  for (size_t i = 0; i < encoded.size(); ++i) steps.push_back(Step{statements[i].sql, &encoded[i]});
  return FlightOrAgain(first, steps);
}

int64_t AffectedRows(const PGresult* res) {
  const char* n = PQcmdTuples(const_cast<PGresult*>(res));
  return static_cast<int64_t>(n && *n ? std::atoll(n) : 0);
}

Rows ToRows(const PGresult* res) {
  Rows rows;
  const int nf = PQnfields(res), nt = PQntuples(res);
  for (int f = 0; f < nf; ++f) rows.columns.emplace_back(PQfname(res, f));
  rows.rows.reserve(nt);
  for (int t = 0; t < nt; ++t) {
    std::vector<Value> row;
    row.reserve(nf);
    for (int f = 0; f < nf; ++f) {
      if (PQgetisnull(res, t, f)) {
        row.emplace_back();
        continue;
      }
      const char* v = PQgetvalue(res, t, f);
      switch (PQftype(res, f)) {
        case kInt8Oid:
        case kInt4Oid:
        case kInt2Oid:
        case kOidOid: row.emplace_back(static_cast<int64_t>(std::atoll(v))); break;
        case kFloat4Oid:
        case kFloat8Oid:
        case kNumericOid: row.emplace_back(std::strtod(v, nullptr)); break;
        case kBoolOid: row.emplace_back(static_cast<int64_t>(v[0] == 't')); break;
        case kByteaOid: {
          size_t len = 0;
          unsigned char* raw = PQunescapeBytea(reinterpret_cast<const unsigned char*>(v), &len);
          row.emplace_back(Blob{std::string(reinterpret_cast<char*>(raw), len)});
          PQfreemem(raw);
          break;
        }
        default: row.emplace_back(std::string(v, PQgetlength(res, t, f)));
      }
    }
    rows.rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace idem::pg_internal
