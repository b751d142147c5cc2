// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Harness: proves a user's handler idempotent, the way production will test
// it. It runs the handler on a throwaway store, once cleanly (each message
// delivered once, in order), then under each Scenario (every message twice,
// redeliveries among later messages, copies racing in threads and in
// processes, a process killed at every crash point, commits in doubt, a lease
// that runs out mid-handler, a downstream answer lost), and checks that the
// business state after each equals the state after the clean run.
//
//   idem::testing::Harness harness({
//       .schema = {"CREATE TABLE balances(account TEXT PRIMARY KEY, cents INTEGER NOT NULL)",
//                  "INSERT INTO balances VALUES ('alice', 0)"},
//       .state_query = "SELECT account, cents FROM balances ORDER BY account",
//   });
//   idem::testing::Report report = harness.Run(
//       {.handler = [](idem::testing::Context&) { return MyHandler; }},
//       {idem::testing::Msg("m-1", "alice 40"), idem::testing::Msg("m-2", "alice 2")});
//   EXPECT_TRUE(report.ok()) << report;          // or EXPECT_IDEMPOTENT (idem/testing/gtest.h)
//
// What a Subject is: a Handler (run through an Inbox, the usual case), a
// CallFirst (its calls, then its transaction), or a whole consumer function
// of your own (anything that takes a message and says whether to
// acknowledge it; idem's Inbox need not be in it). The functions are made
// per process and per run from a Context: the run's store, its Claims, a
// FakeDownstream service and a directory for files of your own.
//
// The crash points are those of the Inbox (doc/reliability.md), reached
// through the store and the handler the harness hands out, so they work in
// every build of idem (kill points need not be compiled in):
//   inbox.before_marker   the transaction begun, the marker not yet inserted
//   inbox.after_marker    the marker inserted, the handler not yet run
//   inbox.after_work      the handler returned, COMMIT not yet issued
//   store.commit_done     COMMIT done, nobody told yet
//   inbox.after_commit    the outcome known, the source not yet acknowledged
//   downstream.after_call the fake service did a call's work, its answer not
//                         yet sent (only for subjects that call it)
// A forked child is killed (SIGKILL) there, then the message is delivered
// again to a fresh consumer in the harness's process.
//
// Thread safety: a Harness runs one Run at a time.
#ifndef IDEM_TESTING_HARNESS_H_
#define IDEM_TESTING_HARNESS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "idem/call_first.h"
#include "idem/claims.h"
#include "idem/env.h"
#include "idem/inbox.h"
#include "idem/message.h"
#include "idem/result.h"
#include "idem/status.h"
#include "idem/store.h"
#include "idem/testing/downstream.h"

namespace idem::testing {

// A message with `id` and `payload` (attempt set by the harness).
Message Msg(std::string id, std::string payload);

// The business state a run leaves, as lines of text: what the clean run and
// every scenario are compared on. Lines are compared as a multiset (their
// order does not matter).
struct State {
  std::vector<std::string> lines{};
};

// What the functions under test get: one per run (a fresh store each) and
// per process (a child killed at a crash point gets its own).
class Context {
 public:
  virtual ~Context() = default;
  // The run's store. For a Subject::consumer, as the harness hands it out:
  // its transactions reach the crash points (open your Inbox on it). For a
  // Subject::handler or call_first, the crash points are the harness's
  // Inbox's, and transactions you open here yourself (a read in the calls
  // part) reach none of them.
  virtual Store& store() = 0;
  // Claims on the run's store, for CallOnce and CallFirst.
  virtual Claims& claims() = 0;
  // The run's fake downstream service (shared by every process of the run).
  virtual FakeDownstream& downstream() = 0;
  // A directory of the run's own, for files of yours (a second database).
  virtual const std::string& dir() const = 0;
  // The run's clock. The harness moves it past leases when a scenario says
  // time passes; a store and a Claims the harness opens read it.
  virtual Env& env() = 0;
  // The URL of the run's store, for a second connection of your own.
  virtual const std::string& store_url() const = 0;
};

struct Subject {
  // A name for reports. Default: "handler".
  std::string name = "handler";
  // Exactly one of these three.
  // A Handler, run through an Inbox.
  std::function<Handler(Context&)> handler{};
  // A CallFirst, run through an Inbox: its calls first, then its apply.
  std::function<CallFirst(Context&)> call_first{};
  // Your whole consumer: called with each delivery; return OK when the
  // delivery may be acknowledged, an error when it must come again.
  std::function<std::function<Status(const Message&)>(Context&)> consumer{};
};

enum class Scenario {
  kTwice,         // every message delivered twice in a row
  kInterleaved,   // every message 4 times, each redelivery after later messages
  kRace,          // two copies of each message in two threads at once
  kConcurrent,    // two threads at once: each every other message, then the other's
  kProcesses,     // two processes deliver every message at once (SQLite)
  kCrash,         // a child killed at each crash point, 3 times per message
  kInDoubt,       // a commit reported in doubt: once rolled back, once committed
  kLeaseExpiry,   // a second delivery starts while the first still runs
  kLostResponse,  // the downstream does the work and its answer is lost
};
// Every scenario, in the order Run tries them.
std::vector<Scenario> AllScenarios();
// "twice", "interleaved", "race", "concurrent", "processes", "crash",
// "in_doubt", "lease_expiry", "lost_response".
std::string_view ScenarioName(Scenario scenario);

// One scenario that broke the subject.
struct Failure {
  Scenario scenario = Scenario::kTwice;
  // What happened, in words: "killed at inbox.after_work on delivery 1 of
  // m-2, then delivered again".
  std::string what{};
  // The message whose delivery first showed it (empty: seen at the end).
  std::string message_id{};
  // The state expected (the clean run's) and found, and their difference:
  // lines only expected ("- ...") and lines only found ("+ ...").
  std::vector<std::string> expected{}, found{}, diff{};
};

struct Report {
  std::string subject{};
  std::string store_kind{};  // "sqlite", "postgres"
  // The clean run's own problems (a delivery that was never acknowledged):
  // nothing is compared when it has any.
  std::vector<std::string> clean_errors{};
  std::vector<Failure> failures{};
  // Scenarios run, and those left out with the reason.
  std::vector<Scenario> ran{};
  std::vector<std::string> skipped{};
  // What this store cannot show, and where to look instead. On SQLite
  // (writers run one at a time): a read-then-write without a lock, and a
  // write through a second connection ("database is locked" in the clean
  // run); both show on PostgreSQL (Options::store_url).
  std::vector<std::string> notes{};
  int64_t deliveries = 0;  // handler deliveries made, in every process

  bool ok() const { return clean_errors.empty() && failures.empty(); }
  // Readable, several lines: what broke, the message, the difference.
  std::string ToString() const;
};
std::ostream& operator<<(std::ostream& os, const Report& report);

class Harness {
 public:
  struct Options {
    // The business tables: statements run in one transaction on each fresh
    // store before anything is delivered.
    std::vector<std::string> schema{};
    // The state to compare: a query on the run's store (each row one line,
    // "column=value" pairs) ...
    std::string state_query{};
    // ... and/or a function of yours (a second database, a file). With
    // both, the lines of both. The fake downstream's effects are always
    // added ("downstream: <request> key=<key>", one line per effect).
    std::function<Result<State>(Context&)> state{};
    // The scenarios to run. Default: all of them.
    std::vector<Scenario> scenarios = AllScenarios();
    // Where the throwaway stores live: "" for a temporary SQLite file per run
    // (removed afterwards), a PostgreSQL URL (a fresh schema per run;
    // TempPostgres in idem/testing/throwaway.h starts a server), or a
    // dynamodb:// URL of DynamoDB Local (a table per run, "<table>-run-..."; the
    // handler writes items, and `state` reads them: schema and state_query
    // are SQL).
    std::string store_url{};
    // The Inbox's consumer name. Default: "test".
    std::string consumer = "test";
    // How far the clock moves when a scenario lets time pass (a crashed
    // holder's lease, a lease running out): more than your CallOnce lease.
    // Default: one hour.
    int64_t lease_expiry_ms = 3'600'000;
    // Deliveries of one message before the harness gives up on it (and
    // reports it never acknowledged). Default: 10.
    int max_deliveries = 10;
  };

  explicit Harness(Options options);
  ~Harness();
  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  // Runs the clean delivery, then every scenario of Options::scenarios, and
  // reports what broke. A problem of the set-up itself (a store that cannot
  // be opened, a schema statement or the state query failing, a Subject
  // with not exactly one function) is returned as an error.
  Result<Report> Run(const Subject& subject, const std::vector<Message>& messages);

 private:
  Options options_;
};

}  // namespace idem::testing

#endif  // IDEM_TESTING_HARNESS_H_
