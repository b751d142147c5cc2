// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Throwaway places for tests: a temporary directory, and a PostgreSQL server
// of the test's own (initdb in a temporary directory, a free port on
// 127.0.0.1, stopped by its PID when the object goes).
//
//   idem::testing::TempDir dir;                          // removed with its contents
//   auto db = idem::testing::TempSqlite::Open();         // a store in a TempDir of its own
//   idem::Inbox inbox((*db)->store());
//
//   auto pg = idem::testing::TempPostgres::Start();      // ~2 s
//   if (!pg.ok()) GTEST_SKIP() << pg.status();           // no server binaries: your choice
//   idem::testing::Harness harness({.store_url = (*pg)->url(), ...});
//
// Thread safety: one owner each.
#ifndef IDEM_TESTING_THROWAWAY_H_
#define IDEM_TESTING_THROWAWAY_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "idem/env.h"
#include "idem/result.h"
#include "idem/store.h"

namespace idem::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it
// when the object goes. Aborts the process when none can be made (a test
// cannot go on without it).
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "idem-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A SQLite store in a temporary directory of its own, removed with it.
class TempSqlite {
 public:
  // `env`: the store's clock (must outlive it; null: the real one).
  // Errors as sqlite::Store::Open's.
  static Result<std::unique_ptr<TempSqlite>> Open(Env* env = nullptr);
  ~TempSqlite();
  TempSqlite(const TempSqlite&) = delete;
  TempSqlite& operator=(const TempSqlite&) = delete;
  Store& store() { return *store_; }
  // "sqlite:<dir>/store.db", for a second connection or OpenStore.
  const std::string& url() const { return url_; }
  const TempDir& dir() const { return *dir_; }

 private:
  TempSqlite() = default;
  std::unique_ptr<TempDir> dir_;  // destroyed after the store
  std::unique_ptr<Store> store_;
  std::string url_;
};

// A PostgreSQL server for one test or test suite: its own cluster in a
// temporary directory, listening on 127.0.0.1 only, at a free port.
class TempPostgres {
 public:
  struct Options {
    // Where initdb and postgres are: "" to look in $PATH, then under
    // /usr/lib/postgresql/*/bin (Debian's packages), newest first.
    std::string bin_dir{};
    // The port: 0 for a free one, chosen from 20000..32767.
    int port = 0;
    // The system user the server runs as when the test runs as root
    // (PostgreSQL refuses root). Default: "postgres".
    std::string run_as = "postgres";
    // fsync off: faster, and a test's data need not survive the machine.
    bool fsync = false;
  };
  // Starts one. kNotFound when the server binaries are absent (install
  // postgresql; a test may skip on that), kUnavailable when it would not
  // start (the server's log is quoted).
  static Result<std::unique_ptr<TempPostgres>> Start(const Options& options);
  static Result<std::unique_ptr<TempPostgres>> Start();
  // Stops the server (SIGINT to its PID, then SIGKILL if it lingers) and
  // removes its directory.
  ~TempPostgres();
  TempPostgres(const TempPostgres&) = delete;
  TempPostgres& operator=(const TempPostgres&) = delete;

  // "postgres://postgres@127.0.0.1:<port>/postgres".
  const std::string& url() const { return url_; }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }

 private:
  TempPostgres() = default;
  std::unique_ptr<TempDir> dir_;
  std::string url_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace idem::testing

#endif  // IDEM_TESTING_THROWAWAY_H_
