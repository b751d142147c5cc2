// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// A small payments service's handlers, each written twice: with one of the
// classic mistakes that pass a unit test and fail in production, and
// corrected. The messages say "<account> <cents>" ("alice 40"): add the
// cents to the account's balance and record the payment.
//
// handlers_test.cc proves the corrected ones idempotent with the test kit
// (idem/testing/harness.h) and shows each wrong one caught, with its report.
#ifndef IDEM_EXAMPLES_TESTING_HANDLERS_H_
#define IDEM_EXAMPLES_TESTING_HANDLERS_H_

#include <sqlite3.h>

#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "idem/call_first.h"
#include "idem/inbox.h"
#include "idem/open.h"
#include "idem/testing/harness.h"

namespace payments {

using idem::testing::Context;

struct Payment {
  std::string account;
  int64_t cents = 0;
};
inline Payment Parse(const idem::Message& m) {
  Payment p;
  std::istringstream in(m.payload);
  in >> p.account >> p.cents;
  return p;
}

// The business tables, and the state the tests compare.
inline const std::vector<std::string> kSchema = {
    "CREATE TABLE balances(account TEXT PRIMARY KEY, cents INTEGER NOT NULL)",
    "CREATE TABLE payments(message_id TEXT NOT NULL, account TEXT NOT NULL, cents INTEGER NOT NULL, receipt TEXT)",
    "INSERT INTO balances VALUES ('alice', 0)",
    "INSERT INTO balances VALUES ('bob', 0)",
};
inline const char* kState =
    "SELECT 'balance' AS kind, account, cents, NULL AS receipt FROM balances UNION ALL "
    "SELECT 'payment', account, cents, receipt FROM payments ORDER BY 1, 2, 3";

// ---- Correct: the effect in the Inbox's transaction, beside the marker.
inline idem::Handler Charge() {
  return [](idem::Transaction& tx, const idem::Message& m) -> idem::Status {
    Payment p = Parse(m);
    IDEM_RETURN_IF_ERROR(
        tx.Exec("UPDATE balances SET cents = cents + $1 WHERE account = $2", {p.cents, p.account}).status());
    return tx.Exec("INSERT INTO payments(message_id, account, cents) VALUES ($1, $2, $3)", {m.id, p.account, p.cents})
        .status();
  };
}

// ---- Mistake 1: the effect outside the transaction. The balance lives in
// another database (a ledger service, here a second SQLite file) and is
// written through its own connection: it commits on its own, before the
// marker, and a crash before the marker's commit makes the redelivery add
// the cents again.
class Ledger {
 public:
  explicit Ledger(const std::string& path) {
    sqlite3_open(path.c_str(), &db_);
    sqlite3_busy_timeout(db_, 10'000);
    sqlite3_exec(db_, "CREATE TABLE IF NOT EXISTS ledger(account TEXT PRIMARY KEY, cents INTEGER NOT NULL)", nullptr,
                 nullptr, nullptr);
  }
  ~Ledger() { sqlite3_close(db_); }
  idem::Status Add(const std::string& account, int64_t cents) {
    std::string sql = "INSERT INTO ledger VALUES ('" + account + "', " + std::to_string(cents) +
                      ") ON CONFLICT(account) DO UPDATE SET cents = cents + excluded.cents";
    char* err = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      idem::Status s = idem::Status::Unavailable(std::string("ledger: ") + (err ? err : "?"));
      sqlite3_free(err);
      return s;
    }
    return idem::Status::OK();
  }
  std::vector<std::string> Lines() {
    std::vector<std::string> out;
    sqlite3_exec(
        db_, "SELECT account, cents FROM ledger ORDER BY account",
        [](void* o, int, char** v, char**) {
          static_cast<std::vector<std::string>*>(o)->push_back(std::string("ledger ") + v[0] + " " + v[1]);
          return 0;
        },
        &out, nullptr);
    return out;
  }

 private:
  sqlite3* db_ = nullptr;
};
inline std::string LedgerPath(Context& ctx) { return ctx.dir() + "/ledger.db"; }

inline idem::Handler ChargeWithOutsideLedger(Context& ctx) {
  auto ledger = std::make_shared<Ledger>(LedgerPath(ctx));
  return [ledger](idem::Transaction& tx, const idem::Message& m) -> idem::Status {
    Payment p = Parse(m);
    IDEM_RETURN_IF_ERROR(ledger->Add(p.account, p.cents));  // WRONG: commits now, on its own
    return tx.Exec("INSERT INTO payments(message_id, account, cents) VALUES ($1, $2, $3)", {m.id, p.account, p.cents})
        .status();
  };
}
// The state of those two: the ledger's lines beside the store's.
inline idem::Result<idem::testing::State> LedgerState(Context& ctx) {
  return idem::testing::State{Ledger(LedgerPath(ctx)).Lines()};
}

// ---- Mistake 2: a call without a key. The provider cannot tell a retry
// from a new charge, so every repeat of the call charges again.
// Correct: send the key CallOnce hands out (DownstreamKey(message, step)).
inline idem::CallFirst ChargeCard(Context& ctx, bool send_key) {
  idem::testing::FakeDownstream* provider = &ctx.downstream();
  return idem::CallFirst(
      ctx.claims(),
      [provider, send_key](idem::Calls& calls, const idem::Message& m) -> idem::Status {
        Payment p = Parse(m);
        return calls
            .Once("charge",
                  [&](const std::string& key) {
                    return provider->Call(send_key ? key : "",  // WRONG when "": no key
                                          "charge " + p.account + " " + std::to_string(p.cents));
                  })
            .status();
      },
      [](idem::Transaction& tx, const idem::Message& m, const idem::Calls& calls) -> idem::Status {
        Payment p = Parse(m);
        IDEM_RETURN_IF_ERROR(
            tx.Exec("UPDATE balances SET cents = cents + $1 WHERE account = $2", {p.cents, p.account}).status());
        return tx
            .Exec("INSERT INTO payments(message_id, account, cents, receipt) VALUES ($1, $2, $3, $4)",
                  {m.id, p.account, p.cents, calls.at("charge")})
            .status();
      });
}

// ---- Mistake 3: an increment with no marker. A consumer of its own that
// updates the balance in a transaction but records nothing about the
// message: each delivery adds again.
inline std::function<idem::Status(const idem::Message&)> IncrementWithoutMarker(Context& ctx) {
  idem::Store* store = &ctx.store();
  return [store](const idem::Message& m) -> idem::Status {
    Payment p = Parse(m);
    IDEM_ASSIGN_OR_RETURN(auto tx, store->Begin());
    IDEM_RETURN_IF_ERROR(
        tx->Exec("UPDATE balances SET cents = cents + $1 WHERE account = $2", {p.cents, p.account}).status());
    IDEM_RETURN_IF_ERROR(
        tx->Exec("INSERT INTO payments(message_id, account, cents) VALUES ($1, $2, $3)", {m.id, p.account, p.cents})
            .status());
    return tx->Commit();
  };
}

// ---- Mistake 4: a write through a second connection. The handler is run
// by the Inbox, but writes the balance through a Store of its own: that
// write commits apart from the marker. (On SQLite the second connection
// waits for the Inbox's write lock until it times out; PostgreSQL lets it
// through, and a crash then doubles the effect.)
inline idem::Handler ChargeThroughSecondConnection(Context& ctx) {
  std::shared_ptr<idem::Store> second(idem::OpenStore(ctx.store_url()).value().release());
  return [second](idem::Transaction& tx, const idem::Message& m) -> idem::Status {
    Payment p = Parse(m);
    IDEM_ASSIGN_OR_RETURN(auto other, second->Begin());  // WRONG: not the Inbox's transaction
    IDEM_RETURN_IF_ERROR(
        other->Exec("UPDATE balances SET cents = cents + $1 WHERE account = $2", {p.cents, p.account}).status());
    IDEM_RETURN_IF_ERROR(other->Commit());
    return tx.Exec("INSERT INTO payments(message_id, account, cents) VALUES ($1, $2, $3)", {m.id, p.account, p.cents})
        .status();
  };
}

// ---- Mistake 5: reading state it should have locked. The balance is read,
// then written back as read + cents. Two messages for one account at once
// both read the old balance, and one addition is lost. (SQLite runs one
// writer at a time, so this shows on PostgreSQL.) Correct: let the database
// add (cents = cents + $1), or read with SELECT ... FOR UPDATE.
inline idem::Handler ChargeReadThenWrite() {
  return [](idem::Transaction& tx, const idem::Message& m) -> idem::Status {
    Payment p = Parse(m);
    IDEM_ASSIGN_OR_RETURN(auto rows, tx.Query("SELECT cents FROM balances WHERE account = $1", {p.account}));
    const int64_t before = rows.rows.empty() ? 0 : rows.rows[0][0].AsInt();  // WRONG: not locked
    IDEM_RETURN_IF_ERROR(
        tx.Exec("UPDATE balances SET cents = $1 WHERE account = $2", {before + p.cents, p.account}).status());
    return tx.Exec("INSERT INTO payments(message_id, account, cents) VALUES ($1, $2, $3)", {m.id, p.account, p.cents})
        .status();
  };
}

// ---- A hidden double effect: a consumer with a marker table of its own
// that is right on the first two deliveries, and skips its check from the
// third on (a "fast path" for messages redelivered often).
inline std::function<idem::Status(const idem::Message&)> DedupeExceptOnThirdDelivery(Context& ctx) {
  idem::Store* store = &ctx.store();
  return [store](const idem::Message& m) -> idem::Status {
    Payment p = Parse(m);
    IDEM_ASSIGN_OR_RETURN(auto tx, store->Begin());
    IDEM_RETURN_IF_ERROR(tx->Exec("CREATE TABLE IF NOT EXISTS seen(message_id TEXT PRIMARY KEY)").status());
    if (m.attempt < 3) {
      IDEM_ASSIGN_OR_RETURN(auto seen, tx->Query("SELECT 1 FROM seen WHERE message_id = $1", {m.id}));
      if (!seen.rows.empty()) return idem::Status::OK();  // a duplicate: acknowledge
    }
    IDEM_RETURN_IF_ERROR(
        tx->Exec("UPDATE balances SET cents = cents + $1 WHERE account = $2", {p.cents, p.account}).status());
    IDEM_RETURN_IF_ERROR(tx->Exec("INSERT INTO seen(message_id) VALUES ($1) ON CONFLICT DO NOTHING", {m.id}).status());
    return tx->Commit();
  };
}

// Twelve payments over two accounts.
inline std::vector<idem::Message> Messages(int n = 12) {
  std::vector<idem::Message> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(idem::testing::Msg("pay-" + std::to_string(i),
                                     std::string(i % 3 ? "alice " : "bob ") + std::to_string(10 + i)));
  }
  return out;
}

}  // namespace payments

#endif  // IDEM_EXAMPLES_TESTING_HANDLERS_H_
