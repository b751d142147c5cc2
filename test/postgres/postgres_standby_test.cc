// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// What a commit must have before a message is acknowledged, with a real
// streaming standby: servers of the test's own (scripts/test-postgres.sh
// start / standby, on ports of their own), since these tests change
// server-wide settings, stop a standby's WAL receiver and kill a primary.
#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "idem/inbox.h"
#include "idem/postgres/store.h"
#include "postgres/pg_test_util.h"
#include "util/test_servers.h"
#include "util/test_util.h"

namespace idem::testing {
namespace {

std::string Script() { return std::string(IDEM_SOURCE_DIR) + "/scripts/test-postgres.sh"; }

int BasePort() {
  const char* p = std::getenv("IDEM_TEST_PG_STANDBY_PORT");
  return p != nullptr && *p != '\0' ? std::atoi(p) : 25443;
}

// One value from a fresh connection to `url` ("error: ..." on failure).
std::string Value1(const std::string& url, const std::string& sql) {
  PGconn* c = PQconnectdb(url.c_str());
  std::string v = "error: " + std::string(PQerrorMessage(c));
  if (PQstatus(c) == CONNECTION_OK) {
    PGresult* r = PQexec(c, sql.c_str());
    v = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 ? PQgetvalue(r, 0, 0)
                                                                  : "error: " + std::string(PQerrorMessage(c));
    PQclear(r);
  }
  PQfinish(c);
  return v;
}

class PostgresStandby : public ::testing::Test {
 protected:
  // A primary at the first free port from `port` on (and a streaming
  // standby at the first free one after it).
  void Start(int port, bool with_standby) {
    primary_ = dir_.File("primary");
    ASSERT_EQ(std::system((Script() + " start " + primary_ + " " + std::to_string(port) + " >/dev/null").c_str()), 0)
        << "could not start the test's own PostgreSQL from port " << port << " on";
    primary_url_ = StartedServerUrl(primary_);
    if (!with_standby) return;
    standby_ = dir_.File("standby");
    const int next = UrlPort(primary_url_) + 1;
    ASSERT_EQ(
        std::system(
            (Script() + " standby " + standby_ + " " + primary_ + " " + std::to_string(next) + " >/dev/null").c_str()),
        0)
        << "could not start a standby from port " << next << " on";
    standby_url_ = StartedServerUrl(standby_);
  }
  void TearDown() override {
    if (receiver_ > 0) ::kill(receiver_, SIGCONT);
    for (const std::string& s : {standby_, primary_})
      if (!s.empty()) (void)std::system((Script() + " stop " + s + " 2>/dev/null").c_str());
  }

  TempDir dir_;
  std::string primary_, standby_, primary_url_, standby_url_;
  pid_t receiver_ = 0;  // a WAL receiver this test stopped
};

// With ack_after = standby_flush a message is acknowledged only once a
// standby has its commit. The standby's WAL receiver is stopped: the next
// message commits on the primary but is not acknowledged. The primary dies,
// the standby is promoted: the acknowledged message's effect is there, and
// the unacknowledged one, redelivered, is applied there once. Acknowledged
// on COMMIT alone (idem_ack_after=commit), that message would have been
// acknowledged and its effect lost.
TEST_F(PostgresStandby, AMessageIsAcknowledgedOnlyOnceAStandbyHasItsCommit) {
  Start(BasePort(), /*with_standby=*/true);
  {
    auto store = postgres::Store::Open(
        {.url = primary_url_ + "?idem_ack_after=standby_flush&idem_standby_wait_ms=1500", .pool_size = 2});
    ASSERT_OK(store);
    ASSERT_OK(CreatePayments(**store));
    auto inbox = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments"});
    for (int copy = 0; copy < 2; ++copy) {
      Outcome first = inbox->Handle(Msg("m-1"), ChargeHandler());
      EXPECT_TRUE(first.ShouldAck()) << first.ToString();
    }
    // The standby stops taking WAL.
    const std::string pid = Value1(standby_url_, "SELECT pid FROM pg_stat_wal_receiver");
    ASSERT_GT(std::atoi(pid.c_str()), 0) << pid;
    receiver_ = static_cast<pid_t>(std::atoi(pid.c_str()));
    ASSERT_EQ(::kill(receiver_, SIGSTOP), 0);
    for (int copy = 0; copy < 2; ++copy) {
      Outcome second = inbox->Handle(Msg("m-2"), ChargeHandler());
      EXPECT_FALSE(second.ShouldAck()) << second.ToString();
      EXPECT_EQ(second.status.code(), Code::kInDoubt) << second.ToString();
      EXPECT_NE(second.status.message().find("standby"), std::string::npos) << second.ToString();
    }
    EXPECT_EQ(Charges(**store, "m-2"), 1);  // committed on the primary alone
    // A claim committed on its own is not started either until a standby has it.
    auto claim = (*store)->claim_store()->TryClaim({.scope = "charges", .key = "k-1", .lease_ms = 30'000});
    EXPECT_EQ(claim.status().code(), Code::kInDoubt) << claim.status();
    EXPECT_NE(claim.status().message().find("claimed"), std::string::npos) << claim.status();
  }
  // The primary dies; the standby (its receiver going again) is promoted.
  const std::string primary_pid = Value1(primary_url_, "SELECT pg_postmaster_start_time() IS NOT NULL");
  ASSERT_EQ(primary_pid, "t");
  ASSERT_EQ(std::system(("kill -KILL $(cat " + primary_ + "/pid)").c_str()), 0);
  ASSERT_EQ(::kill(receiver_, SIGCONT), 0);
  receiver_ = 0;
  ASSERT_EQ(std::system(("runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl promote -w -D $(cat " + standby_ +
                         "/base)/data >/dev/null")
                            .c_str()),
            0);
  auto promoted = postgres::Store::Open({.url = standby_url_, .pool_size = 2});
  ASSERT_OK(promoted);
  auto inbox = MustOpen<Inbox>(**promoted, Inbox::Options{.consumer = "payments"});
  EXPECT_EQ(Charges(**promoted, "m-1"), 1) << "an acknowledged effect was lost in the failover";
  for (const char* id : {"m-1", "m-2"})
    for (int copy = 0; copy < 2; ++copy) EXPECT_TRUE(inbox->Handle(Msg(id), ChargeHandler()).ShouldAck()) << id;
  EXPECT_EQ(Charges(**promoted, "m-1"), 1);
  EXPECT_EQ(Charges(**promoted, "m-2"), 1);
}

// A COMMIT waiting for its synchronous standby, cancelled (here by
// pg_cancel_backend; a statement_timeout does the same): the server commits
// it locally and answers COMMIT with only a warning. idem reports it in
// doubt, never as a commit a failover cannot lose.
TEST_F(PostgresStandby, ACommitWhoseSynchronousWaitIsCancelledIsInDoubt) {
  Start(BasePort() + 3, /*with_standby=*/false);
  auto store = postgres::Store::Open({.url = primary_url_, .pool_size = 2});
  ASSERT_OK(store);
  ASSERT_OK(CreatePayments(**store));
  ASSERT_EQ(PgAdmin("ALTER SYSTEM SET synchronous_standby_names = 'nobody'", primary_url_), "");
  ASSERT_EQ(PgAdmin("SELECT pg_reload_conf()", primary_url_), "");
  // pg_reload_conf() only signals. The backend reads the new setting between
  // two statements, and the checkpointer publishes "a synchronous standby is
  // named" to shared memory when it gets to it; until both have happened a
  // COMMIT does not wait for any standby and simply succeeds. So a commit that
  // finished without waiting is tried again with a new row.
  Status committed;
  std::string cancelled;
  std::string id;
  for (int attempt = 0; attempt < 20 && cancelled != "1"; ++attempt) {
    id = "c-" + std::to_string(attempt);
    auto tx = (*store)->Begin();
    ASSERT_OK(tx);
    ASSERT_OK((*tx)->Exec("INSERT INTO payments(message_id, cents) VALUES ($1, 1)", {id}).status());
    std::atomic<bool> done{false};
    std::thread commit([&] {
      committed = (*tx)->Commit();
      done = true;
    });
    // Cancel the wait once the backend is in it.
    for (int i = 0; i < 600 && cancelled != "1" && !done; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      cancelled = Value1(primary_url_,
                         "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity WHERE wait_event = 'SyncRep'");
    }
    commit.join();
  }
  EXPECT_EQ(cancelled, "1");
  EXPECT_EQ(committed.code(), Code::kInDoubt) << committed;
  EXPECT_NE(committed.message().find("synchronous standby was cancelled"), std::string::npos) << committed;
  ASSERT_EQ(PgAdmin("ALTER SYSTEM RESET synchronous_standby_names", primary_url_), "");
  ASSERT_EQ(PgAdmin("SELECT pg_reload_conf()", primary_url_), "");
  EXPECT_EQ(Charges(**store, id), 1);  // committed locally, as the warning says
}

}  // namespace
}  // namespace idem::testing
