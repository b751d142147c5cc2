// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The PostgreSQL test server (started by the CTest fixture "postgres", see
// scripts/test-postgres.sh) and fresh schemas on it, one per test.
#ifndef IDEM_TEST_POSTGRES_PG_TEST_UTIL_H_
#define IDEM_TEST_POSTGRES_PG_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>

#include "idem/env.h"
#include "idem/postgres/store.h"
#include "idem/testing/kill_points.h"
#include "util/test_servers.h"

namespace idem::testing {

// The server's URL (util/test_servers.h). A missing server is a failure,
// never a skip.
inline std::string PgUrl() { return FixtureServerUrl("pg", "postgres://127.0.0.1:1/none"); }

// Runs SQL on the test server as the admin; returns the error text or "".
inline std::string PgAdmin(const std::string& sql, const std::string& url = PgUrl()) {
  PGconn* c = PQconnectdb(url.c_str());
  std::string err;
  if (PQstatus(c) != CONNECTION_OK) {
    err = PQerrorMessage(c);
  } else {
    PGresult* r = PQexec(c, sql.c_str());
    if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) err = PQerrorMessage(c);
    PQclear(r);
  }
  PQfinish(c);
  return err;
}

// A URL whose connections use the schema named after `key` (search_path),
// created if missing, so tests running at once never see each other's
// tables while one test's processes share one.
inline std::string SchemaUrl(const std::string& key) {
  std::string schema = "t_" + std::to_string(std::hash<std::string>{}(key) % 1'000'000'000'000ULL);
  std::string err = PgAdmin("CREATE SCHEMA IF NOT EXISTS " + schema);
  EXPECT_EQ(err, "");
  std::string url = PgUrl();
  url += url.find('?') == std::string::npos ? "?" : "&";
  url += "options=-csearch_path%3D" + schema;
  return url;
}

// A fresh, empty schema.
inline std::string FreshSchemaUrl() {
  static std::atomic<int> counter{0};
  std::string key =
      std::to_string(::getpid()) + "/" + std::to_string(counter++) + "/" + std::to_string(::time(nullptr));
  PgAdmin("DROP SCHEMA IF EXISTS t_" + std::to_string(std::hash<std::string>{}(key) % 1'000'000'000'000ULL) +
          " CASCADE");
  return SchemaUrl(key);
}

// ---- the same server behind pgbouncer in transaction mode (the fixture
// "pgbouncer", scripts/test-pgbouncer.sh). pgbouncer refuses a URL's
// options=-c search_path: a schema per test comes with a role of its own
// whose search_path it is.
// The pooler's address, as USER to DB.
inline std::string Pooler(const std::string& user, const std::string& db) {
  const int port = UrlPort(FixtureServerUrl("pgbouncer", "postgres://127.0.0.1:1/none"));
  return "postgres://" + user + "@127.0.0.1:" + std::to_string(port) + "/" + db;
}

// A role and schema of its own for `key`, whose search_path is that schema,
// and its URL through the pooler (pools are per database and user).
inline std::string PooledSchemaUrl(const std::string& key) {
  const std::string name = "pgb_" + std::to_string(std::hash<std::string>{}(key) % 1'000'000'000'000ULL);
  const std::string admin = Pooler("postgres", "idem_test");
  PgAdmin("CREATE ROLE " + name + " LOGIN SUPERUSER", admin);  // (already there: the same key again)
  EXPECT_EQ(PgAdmin("CREATE SCHEMA IF NOT EXISTS " + name + " AUTHORIZATION " + name, admin), "");
  EXPECT_EQ(PgAdmin("ALTER ROLE " + name + " SET search_path = " + name, admin), "");
  return Pooler(name, "idem_test");
}

// A fresh schema (and its role), through the pooler.
inline std::string FreshPooledSchemaUrl() {
  static std::atomic<int> counter{0};
  return PooledSchemaUrl(std::to_string(::getpid()) + "/" + std::to_string(counter++) + "/" +
                         std::to_string(::time(nullptr)));
}

// How many requests `run` makes that PostgreSQL must answer before the client
// goes on: the n-th hit of postgres.round_trip (on any thread) is armed for
// n = 1, 2, ... until a run no longer reaches it. `run` must do the same work
// every call.
inline int RoundTrips(const std::function<void()>& run) {
  for (int n = 1; n <= 64; ++n) {
    std::atomic<bool> reached{false};
    ArmKillPoint("postgres.round_trip", n, [&] { reached = true; });
    run();
    DisarmKillPoints();
    if (!reached) return n - 1;
  }
  return -1;
}

}  // namespace idem::testing

#endif  // IDEM_TEST_POSTGRES_PG_TEST_UTIL_H_
