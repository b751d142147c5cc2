// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// A real crash on librdkafka's mock cluster: a consumer is SIGKILLed right
// after a commit in the store and before the ack (kill point
// "inbox.after_commit"); the group gives its partitions to another member,
// which receives the committed-but-unacknowledged record again and the Inbox
// absorbs it.
//
// librdkafka must not be used in a child fork()ed after the parent started
// librdkafka threads (the mock cluster runs in the parent). So the victim is
// this very binary, fork()+exec()ed with --gtest_filter=KafkaCrashChild.*:
// the child test reads the cluster's address, topic, group and SQLite path
// from IDEM_KAFKA_CRASH_CHILD_* environment variables and arms the kill point
// from IDEM_KILL_AT. Run as part of the normal suite (no such variables), the
// child test is skipped.
//
// Nothing waits for time to pass: the parent waits for conditions (the child
// dead, effects in the store, offsets committed) in bounded loops.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "idem/consumer.h"
#include "idem/env.h"
#include "idem/inbox.h"
#include "idem/kafka/source.h"
#include "idem/sqlite/store.h"
#include "idem/testing/kill_points.h"
#include "mock_kafka.h"
#include "util/test_util.h"

extern char** environ;

namespace idem::testing {
namespace {

constexpr char kTopic[] = "payments";
constexpr char kGroup[] = "payments";
constexpr int kPartitions = 4;

// The child's inputs, set by the parent in the child's environment only.
constexpr char kEnvBrokers[] = "IDEM_KAFKA_CRASH_CHILD_BROKERS";
constexpr char kEnvTopic[] = "IDEM_KAFKA_CRASH_CHILD_TOPIC";
constexpr char kEnvGroup[] = "IDEM_KAFKA_CRASH_CHILD_GROUP";
constexpr char kEnvStore[] = "IDEM_KAFKA_CRASH_CHILD_STORE";
constexpr char kEnvLog[] = "IDEM_KAFKA_CRASH_CHILD_LOG";

std::string Id(int i) { return "m-" + std::to_string(i); }

// Short timers and backoffs (the mock cluster answers at once); the same in
// the parent and the child, so that the dead member's session runs out soon.
kafka::Source::Options SourceOptions(std::string brokers, std::string topic, std::string group) {
  return {.brokers = std::move(brokers),
          .topic = std::move(topic),
          .group = std::move(group),
          .session_timeout_ms = 6'000,
          .heartbeat_interval_ms = 200,
          .max_poll_interval_ms = 20'000,  // bounds a rebalance (kafka_delivery_suite_test.cc)
          .config = {{"fetch.wait.max.ms", "20"},
                     {"fetch.error.backoff.ms", "20"},
                     {"reconnect.backoff.ms", "20"},
                     {"retry.backoff.ms", "20"},
                     {"topic.metadata.refresh.interval.ms", "500"}}};
}

// The child's record of the acks its source took, written with write(2) to
// an O_APPEND file so that every line survives the SIGKILL: "A <id>".
class AckLoggingSource final : public Source {
 public:
  AckLoggingSource(Source& inner, int fd) : inner_(inner), fd_(fd) {}
  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override { return inner_.Receive(max, wait_ms); }
  Status Ack(const Delivery& d) override {
    Status s = inner_.Ack(d);
    if (s.ok()) {
      const std::string line = "A " + d.message.id + "\n";
      std::lock_guard<std::mutex> l(mu_);
      if (::write(fd_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) ::_exit(21);
    }
    return s;
  }
  Status Nack(const Delivery& d, int64_t delay_ms) override { return inner_.Nack(d, delay_ms); }
  std::string_view Kind() const override { return inner_.Kind(); }

 private:
  Source& inner_;
  int fd_;
  std::mutex mu_;
};

// The parent's record of the ids it received.
class RecordingSource final : public Source {
 public:
  explicit RecordingSource(Source& inner) : inner_(inner) {}
  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override {
    auto got = inner_.Receive(max, wait_ms);
    if (got.ok()) {
      std::lock_guard<std::mutex> l(mu_);
      for (const Delivery& d : *got) received_.insert(d.message.id);
    }
    return got;
  }
  Status Ack(const Delivery& d) override { return inner_.Ack(d); }
  Status Nack(const Delivery& d, int64_t delay_ms) override { return inner_.Nack(d, delay_ms); }
  std::string_view Kind() const override { return inner_.Kind(); }
  bool Received(const std::string& id) {
    std::lock_guard<std::mutex> l(mu_);
    return received_.count(id) > 0;
  }

 private:
  Source& inner_;
  std::mutex mu_;
  std::multiset<std::string> received_;
};

// ---------------------------------------------------------------------------
// The child: runs only when exec()ed by the parent below.
// ---------------------------------------------------------------------------

TEST(KafkaCrashChild, ConsumesUntilKilled) {
  const char* brokers = std::getenv(kEnvBrokers);
  ASSERT_NE(brokers, nullptr) << "the victim of KafkaCrash.*: runs only when that test starts it";
  const char* topic = std::getenv(kEnvTopic);
  const char* group = std::getenv(kEnvGroup);
  const char* store_path = std::getenv(kEnvStore);
  const char* log_path = std::getenv(kEnvLog);
  ASSERT_TRUE(topic && group && store_path && log_path);
  const int fd = ::open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  ASSERT_GE(fd, 0);
  auto store = sqlite::Store::Open({.path = store_path, .synchronous = sqlite::Synchronous::kNormal});
  ASSERT_OK(store);
  auto inbox_owned = MustOpen<Inbox>(**store, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  auto src = kafka::Source::Open(SourceOptions(brokers, topic, group));
  ASSERT_OK(src);
  AckLoggingSource logged(**src, fd);
  ASSERT_TRUE(ArmKillPointFromEnv()) << "IDEM_KILL_AT is not set";
  // One worker, one delivery at a time: exactly one delivery is committed
  // and not acknowledged when the kill point fires.
  auto consumer_owned = MustOpen<Consumer>(logged, inbox, ChargeHandler(),
                                           Consumer::Options{.workers = 1, .batch = 1, .receive_wait_ms = 100});
  Consumer& consumer = *consumer_owned;
  std::thread watchdog([&] {
    std::this_thread::sleep_for(std::chrono::seconds(120));
    consumer.Stop();
  });
  (void)consumer.Run();
  watchdog.join();
  ADD_FAILURE() << "the kill point was never reached";
}

// ---------------------------------------------------------------------------
// The parent.
// ---------------------------------------------------------------------------

class KafkaCrash : public ::testing::Test {
 protected:
  void SetUp() override {
    kafka_ = std::make_unique<MockKafka>(kTopic, kPartitions, kGroup);
    ASSERT_TRUE(kafka_->ok()) << kafka_->error();
    mock_ = kafka_->cluster();
    brokers_ = kafka_->brokers();

    auto s = sqlite::Store::Open({.path = StorePath(), .synchronous = sqlite::Synchronous::kNormal});
    ASSERT_OK(s);
    store_ = std::move(*s);
    ASSERT_TRUE(CreatePayments(*store_).ok());
  }

  void TearDown() override {
    if (child_ > 0) {  // a failed test left the child running
      ::kill(child_, SIGKILL);
      ::waitpid(child_, nullptr, 0);
    }
    kafka_.reset();
  }

  std::string StorePath() const { return dir_.File("store.db"); }
  std::string LogPath() const { return dir_.File("child.log"); }
  std::string OutPath() const { return dir_.File("child.out"); }

  std::string ChildOutput() const {
    std::ifstream in(OutPath());
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // Starts this binary again as KafkaCrashChild.ConsumesUntilKilled with the
  // kill point armed at the `hit`-th "inbox.after_commit". Everything is
  // prepared before fork(): between fork() and exec() the child calls only
  // async-signal-safe functions.
  void SpawnChild(int hit) {
    std::vector<std::string> args = {"/proc/self/exe", "--gtest_filter=KafkaCrashChild.ConsumesUntilKilled"};
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string_view v(*e);
      if (v.starts_with("IDEM_KILL_AT=") || v.starts_with("IDEM_KAFKA_CRASH_CHILD_") || v.starts_with("GTEST_"))
        continue;
      env.emplace_back(v);
    }
    env.push_back(std::string(kEnvBrokers) + "=" + brokers_);
    env.push_back(std::string(kEnvTopic) + "=" + kTopic);
    env.push_back(std::string(kEnvGroup) + "=" + kGroup);
    env.push_back(std::string(kEnvStore) + "=" + StorePath());
    env.push_back(std::string(kEnvLog) + "=" + LogPath());
    env.push_back("IDEM_KILL_AT=inbox.after_commit:" + std::to_string(hit));
    std::vector<char*> argv, envp;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    const std::string out = OutPath();

    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
      }
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    child_ = pid;
  }

  // Waits (bounded) for the child to end; its wait status, or -1 when it is
  // still running (then it is SIGKILLed here and the test fails).
  int WaitChild(int64_t timeout_ms = 150'000) {
    int status = 0;
    bool done = WaitFor(
        [&] {
          const pid_t r = ::waitpid(child_, &status, WNOHANG);
          return r == child_ || r < 0;
        },
        timeout_ms);
    if (!done) {
      ::kill(child_, SIGKILL);
      ::waitpid(child_, nullptr, 0);
      status = -1;
    }
    child_ = -1;
    return status;
  }

  // Publishes m-0..m-(n-1), then all of them again (a producer retry: same
  // id header, a second record). Keyed by id: both copies of a message land
  // in one partition, the first before the second.
  void PublishTwice(int n) {
    auto p = kafka::Publisher::Open({.brokers = brokers_, .topic = kTopic, .config = {{"linger.ms", "5"}}});
    ASSERT_OK(p);
    for (int round = 0; round < 2; ++round)
      for (int i = 0; i < n; ++i) ASSERT_TRUE((*p)->Produce(Msg(Id(i))).ok());
    Status f = (*p)->Flush();
    ASSERT_TRUE(f.ok()) << f;
  }

  rd_kafka_t* Admin() { return kafka_->Admin(); }

  bool AllCommitted() { return kafka_->AllCommitted(); }

  std::set<std::string> AckedByChild() {
    std::set<std::string> acked;
    std::ifstream in(LogPath());
    for (std::string line; std::getline(in, line);) {
      std::istringstream ls(line);
      std::string kind, id;
      ls >> kind >> id;
      if (kind == "A")
        acked.insert(id);
      else
        ADD_FAILURE() << "bad log line: " << line;
    }
    return acked;
  }

  TempDir dir_;
  std::unique_ptr<MockKafka> kafka_;
  rd_kafka_mock_cluster_t* mock_ = nullptr;  // kafka_'s
  std::string brokers_;
  std::unique_ptr<Store> store_;
  pid_t child_ = -1;
};

TEST_F(KafkaCrash, AConsumerKilledAfterCommitBeforeAckIsRedeliveredToAnotherConsumerAndAbsorbed) {
  constexpr int kN = 40;
  // The child dies right after its first commit, before that ack: on an
  // empty store the first commit always applies (a later one may be a
  // duplicate's when librdkafka fetched a record again inside the child, and
  // then nothing would be committed and not acked).
  constexpr int kKillAt = 1;
  ASSERT_NO_FATAL_FAILURE(PublishTwice(kN));

  ASSERT_NO_FATAL_FAILURE(SpawnChild(kKillAt));
  const int status = WaitChild();
  ASSERT_TRUE(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the child did not die by SIGKILL (wait status " << status << ", exit code "
      << (status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1) << "); its output:\n"
      << ChildOutput();

  // What the child left: effects committed in the store, and the acks its
  // source took. The difference is what was committed and never acked.
  const int64_t applied_by_child = Charges(*store_);
  EXPECT_GE(applied_by_child, 1);
  EXPECT_LE(applied_by_child, kKillAt);
  const std::set<std::string> acked = AckedByChild();
  std::vector<std::string> committed_not_acked;
  for (int i = 0; i < kN; ++i) {
    const int64_t n = Charges(*store_, Id(i));
    EXPECT_LE(n, 1) << Id(i);
    if (n == 1 && acked.count(Id(i)) == 0) committed_not_acked.push_back(Id(i));
  }
  ASSERT_EQ(committed_not_acked.size(), 1u) << "one worker, one delivery at a time: one committed, not acked";
  EXPECT_FALSE(AllCommitted()) << "the unacknowledged record's offset cannot have been committed";

  // Another member of the group on the same store. The dead member's
  // partitions come to it once its session runs out.
  auto inbox_owned = MustOpen<Inbox>(*store_, Inbox::Options{.consumer = "payments"});
  Inbox& inbox = *inbox_owned;
  auto src = kafka::Source::Open(SourceOptions(brokers_, kTopic, kGroup));
  ASSERT_OK(src);
  RecordingSource recorded(**src);
  {
    auto consumer_owned = MustOpen<Consumer>(recorded, inbox, ChargeHandler(),
                                             Consumer::Options{.workers = 2,
                                                               .batch = 1,
                                                               .max_attempts = 5,
                                                               .backoff_base_ms = 5,
                                                               .backoff_max_ms = 50,
                                                               .receive_wait_ms = 100});
    Consumer& consumer = *consumer_owned;
    std::thread run([&] { (void)consumer.Run(); });
    const bool drained = WaitFor([&] {
      if (Charges(*store_) < kN) return false;
      (void)(*src)->CommitSync();
      return AllCommitted();
    });
    consumer.Stop();
    run.join();
    ASSERT_TRUE(drained) << "effects " << Charges(*store_) << " of " << kN << ", assignment "
                         << (*src)->Assignment().size() << " partitions";
  }
  EXPECT_EQ((*src)->Assignment().size(), static_cast<size_t>(kPartitions)) << "the dead member's partitions";

  // Nothing lost, nothing doubled: one payments row and one marker per id.
  for (int i = 0; i < kN; ++i) EXPECT_EQ(Charges(*store_, Id(i)), 1) << Id(i);
  EXPECT_EQ(Charges(*store_), kN);
  auto markers = store_->CountMarkers("payments");
  ASSERT_TRUE(markers.ok());
  EXPECT_EQ(*markers, kN);

  // The record committed and not acked came to the new member and was
  // absorbed: the new member applied only what the child had not, and
  // counted as duplicates the second copy of each of those plus both copies
  // of the committed-not-acked message.
  for (const std::string& id : committed_not_acked) EXPECT_TRUE(recorded.Received(id)) << id;
  const InboxCounters c = inbox.counters();
  EXPECT_EQ(c.applied, static_cast<uint64_t>(kN - applied_by_child));
  EXPECT_GE(c.duplicates, 1u);
  EXPECT_GE(c.duplicates, static_cast<uint64_t>(kN - applied_by_child) + 2 * committed_not_acked.size());
  EXPECT_EQ(c.conflicts, 0u);
}

}  // namespace
}  // namespace idem::testing

// The victim runs only when the crash test starts this binary as one (the
// environment says so); otherwise it is not even listed, so no run shows it
// as skipped.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const bool victim = std::getenv("IDEM_KAFKA_CRASH_CHILD_BROKERS") != nullptr;
  std::string filter = ::testing::GTEST_FLAG(filter);
  if (victim) {
    filter = "KafkaCrashChild.*";
  } else {
    // Keep what the caller asked for (ctest names one test), minus the victim.
    filter += filter.find('-') == std::string::npos ? "-KafkaCrashChild.*" : ":KafkaCrashChild.*";
  }
  ::testing::GTEST_FLAG(filter) = filter;
  return RUN_ALL_TESTS();
}
