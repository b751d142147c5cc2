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

namespace idem::testing {

// The server's URL. A missing server is a failure, never a skip.
inline std::string PgUrl() {
  const char* url = std::getenv("IDEM_TEST_PG_URL");
  if (url == nullptr || *url == '\0') {
    ADD_FAILURE()
        << "IDEM_TEST_PG_URL is not set: run the tests with ctest (its fixture starts PostgreSQL) or ./run test";
    return "postgres://127.0.0.1:1/none";
  }
  return url;
}

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
