// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/testing/downstream.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>

#include "idem/message.h"
#include "sqlite_driver/db.h"

namespace idem::testing {

using sqlite_driver::Db;

struct FakeDownstream::Impl {
  std::mutex mu;
  std::unique_ptr<Db> db;
  pid_t pid = 0;  // the process that opened db (a child opens its own)
  Fault fault;
  int64_t calls_since_arm = 0;
  std::function<void()> hook;

  Result<Db*> Conn(const std::string& path);
  // A parent's connection, inherited by fork, is never touched (not closed).
  void DropInherited() {
    if (db != nullptr && pid != ::getpid()) (void)db.release();
  }
  ~Impl() { DropInherited(); }
};

namespace {

// One statement with text parameters; rows as text. Errors as the driver
// translates them, named as the test kit's downstream's.
Result<std::vector<std::vector<std::string>>> Run(Db& db, std::string_view sql,
                                                  std::initializer_list<std::string_view> params) {
  std::vector<Value> values(params.begin(), params.end());
  auto rows = db.Query(sql, values);
  if (!rows.ok()) return rows.status().WithContext("FakeDownstream");
  std::vector<std::vector<std::string>> out;
  for (const auto& r : rows->rows) {
    std::vector<std::string> row;
    for (const Value& v : r) row.push_back(v.AsText());
    out.push_back(std::move(row));
  }
  return out;
}

}  // namespace

FakeDownstream::FakeDownstream(std::string path) : path_(std::move(path)), impl_(std::make_unique<Impl>()) {}
FakeDownstream::~FakeDownstream() = default;

void FakeDownstream::Arm(Fault fault) {
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->fault = fault;
  impl_->calls_since_arm = 0;
}

void FakeDownstream::OnNextEffect(std::function<void()> hook) {
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->hook = std::move(hook);
}

// The connection of this process, opened (and the table made) on first use.
Result<Db*> FakeDownstream::Impl::Conn(const std::string& path) {
  if (db != nullptr && pid == ::getpid()) return db.get();
  DropInherited();
  auto opened = Db::Open({.path = path, .busy_timeout_ms = 30'000});
  if (!opened.ok()) return opened.status().WithContext("FakeDownstream");
  IDEM_RETURN_IF_ERROR(Run(**opened,
                           "CREATE TABLE IF NOT EXISTS calls(seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, "
                           "request TEXT NOT NULL, response TEXT NOT NULL, effect INTEGER NOT NULL)",
                           {})
                           .status());
  db = std::move(*opened);
  pid = ::getpid();
  return db.get();
}

Result<std::string> FakeDownstream::Call(std::string_view key, std::string_view request) {
  std::function<void()> hook;
  bool lose = false, kill = false;
  std::string response;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    IDEM_ASSIGN_OR_RETURN(Db * conn, impl_->Conn(path_));
    Db& db = *conn;
    const int64_t n = ++impl_->calls_since_arm;
    lose = impl_->fault.kind == Fault::Kind::kLoseResponse && n == impl_->fault.at;
    kill = impl_->fault.kind == Fault::Kind::kKillAfterWork && n == impl_->fault.at;
    IDEM_RETURN_IF_ERROR(Run(db, "BEGIN IMMEDIATE", {}).status());
    auto done = [&]() -> Result<bool> {
      if (!key.empty()) {
        IDEM_ASSIGN_OR_RETURN(auto prior,
                              Run(db, "SELECT request, response FROM calls WHERE key = ?1 AND effect = 1", {key}));
        if (!prior.empty()) {
          if (prior[0][0] != request) {
            return Status::Conflict("FakeDownstream: key " + Printable(key) + " was used for another request (" +
                                    Printable(prior[0][0]) + ")");
          }
          response = prior[0][1];
          IDEM_RETURN_IF_ERROR(Run(db, "INSERT INTO calls(key, request, response, effect) VALUES (?1, ?2, ?3, 0)",
                                   {key, request, response})
                                   .status());
          return false;
        }
      }
      // The receipt: from the key, or from the request and how many keyless
      // calls made it before (so a clean run and a repeat name their
      // effects alike).
      std::string basis(key);
      if (key.empty()) {
        IDEM_ASSIGN_OR_RETURN(auto count,
                              Run(db, "SELECT count(*) FROM calls WHERE key = '' AND request = ?1", {request}));
        basis = "nokey:" + std::string(request) + "#" + count[0][0];
      }
      response = "ds-" + ToHex(FingerprintOf(basis)).substr(0, 16);
      IDEM_RETURN_IF_ERROR(
          Run(db, "INSERT INTO calls(key, request, response, effect) VALUES (?1, ?2, ?3, 1)", {key, request, response})
              .status());
      return true;
    }();
    if (!done.ok()) {
      (void)Run(db, "ROLLBACK", {});
      return done.status();
    }
    IDEM_RETURN_IF_ERROR(Run(db, "COMMIT", {}).status());
    if (*done) hook = std::move(impl_->hook), impl_->hook = nullptr;
  }
  if (kill) {
    std::fflush(nullptr);
    ::kill(::getpid(), SIGKILL);
  }
  if (hook) hook();
  if (lose) {
    return Status::Unavailable("FakeDownstream: the answer to the call with key " +
                               (key.empty() ? std::string("(none)") : Printable(key)) + " was lost on its way back");
  }
  return response;
}

Result<std::vector<FakeDownstream::Record>> FakeDownstream::Calls() {
  std::lock_guard<std::mutex> l(impl_->mu);
  IDEM_ASSIGN_OR_RETURN(Db * db, impl_->Conn(path_));
  IDEM_ASSIGN_OR_RETURN(auto rows, Run(*db, "SELECT key, request, response, effect FROM calls ORDER BY seq", {}));
  std::vector<Record> out;
  for (auto& r : rows) out.push_back({.key = r[0], .request = r[1], .response = r[2], .effect = r[3] == "1"});
  return out;
}

Result<std::vector<std::string>> FakeDownstream::Effects() {
  IDEM_ASSIGN_OR_RETURN(auto calls, Calls());
  std::vector<std::string> out;
  for (const Record& c : calls) {
    if (c.effect) out.push_back(c.request + " key=" + (c.key.empty() ? "none" : c.key));
  }
  return out;
}

}  // namespace idem::testing
