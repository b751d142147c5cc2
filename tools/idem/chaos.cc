// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem chaos: the payments workload across processes, broken on purpose
// while it runs, then checked by counting effects against an oracle kept
// outside every database under test.
//
//   parent ──publishes──▶ source ──▶ M consumer processes ──HTTP──▶ provider process
//     │ oracle.log (every publication)      │ journal/<slot>-<life>.log (R/S/L/A)
//     └ killer: SIGKILLs consumers at random times and arms kill points in
//       each new consumer life (IDEM_KILL_AT), injects faults (I/O errors in
//       SQLite through the fault VFS, PostgreSQL backends terminated, lost
//       acks, leases expiring under stalled consumers, lost provider
//       responses) and restarts whatever died; then drains and checks.
//
// Every decision of the schedule comes from the seed: consumer slot s draws
// its lives' kill points, hit counts and kill times from a generator seeded
// by (seed, s), the provider from (seed, provider), the producer from the
// seed. What the processes do between those decisions is up to the OS
// scheduler, so a seed replays the same schedule of faults, not the same
// interleaving.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <httplib.h>

#include "commands.h"
#include "cut_proxy.h"
#include "idem/consumer.h"
#include "idem/embedded/queue.h"
#include "idem/inbox.h"
#include "idem/postgres/store.h"
#include "idem/testing/fault_vfs.h"
#include "idem/sqlite/store.h"
#include "payments.h"
#include "sources.h"

extern char** environ;

namespace idem::cli {
namespace {

constexpr const char* kConsumer = "idem-chaos";
constexpr const char* kTable = "chaos_payments";

struct Config {
  std::string dir, source, store;
  int64_t messages = 3'000;
  int consumers = 4;
  int64_t kills = 100;
  uint64_t seed = 1;
  double dup_rate = 0.05;
  double lost_ack_rate = 0.02;
  double stall_rate = 0.005;
  double lost_response_rate = 0.02;
  double fault_rate = 0.15;  // share of consumer lives given a fault instead of a kill point
  int64_t lease_ms = 400;
  int batch = 8;
  int64_t drain_timeout_ms = 60'000;
  // A kill point fires at its 1st..hits-th hit (drawn); timed kills come
  // within 10..(60 x hits) ms. Larger: longer lives, fewer process starts
  // per message (long runs).
  int64_t hits = 4;
  // A shell command that restarts the broker (or the database) under test,
  // run `restarts` times, evenly spread over the kills.
  std::string restart_cmd;
  int64_t restarts = 2;
  bool json = false;
  // A deliberately broken consumer, to show the check catches what it
  // claims to: "" (the real one), "no-guard" (effect without the marker) or
  // "ack-before-commit" (the delivery acknowledged before the transaction).
  std::string broken;
  // How the provider commits POST /charges: "two-phase" (claim committed,
  // charge, response committed) or "group-commit" (--one-transaction
  // --group-commit: claim, charge and response of many requests in one
  // transaction).
  std::string provider_mode = "two-phase";
  // The provider's own store; empty: sqlite:DIR/provider.db (synchronous=normal).
  std::string provider_store;
  // Worker mode (internal): this process is consumer `slot`, life `life`.
  int slot = -1;
  int64_t life = 0;
  std::string provider;
};

// The consumers' retries, in one place: what the workers run with and what
// the parent computes their budget from.
constexpr int kClientAttempts = 4;        // tries of one POST /charges (ProviderClient: backoff 2..100 ms)
constexpr int kClientBackoffMaxMs = 100;  // as ProviderClient sets it
// Failures before a message is dead-lettered (a dead letter counts as lost).
// Kills and in-progress outcomes count none; what counts is the store's own
// errors (I/O faults, backends terminated), each its own failure.
constexpr int kConsumerMaxAttempts = 5;
constexpr int64_t kConsumerBackoffBaseMs = 5, kConsumerBackoffMaxMs = 100;

Consumer::Options ChaosConsumerOptions(const Config& cfg) {
  // Odd slots take batches (the mid-batch kill point lives there). No
  // crash-loop cut-off (max_deliveries): chaos kills consumers on purpose.
  return {.workers = 1,
          .batch = cfg.slot % 2 == 1 ? std::max(1, cfg.batch) : 1,
          .max_attempts = kConsumerMaxAttempts,
          .max_deliveries = 0,
          .backoff_base_ms = kConsumerBackoffBaseMs,
          .backoff_max_ms = kConsumerBackoffMaxMs,
          .receive_wait_ms = 100};
}

// The longest a consumer keeps trying a message whose every try fails
// before it gives up on it (dead letter): max_attempts deliveries, each
// making kClientAttempts calls, and the consumer's backoff (with its +25%
// jitter) between the deliveries. Between the calls the client waits its
// longest backoff: a 409 carries Retry-After (whole seconds), which raises
// every wait to the client's backoff_max_ms. The time the requests
// themselves take is not counted (loopback, milliseconds): a lease above
// this outlasts the consumers' retries.
int64_t ConsumerRetryBudgetMs() {
  const Consumer::Options o = ChaosConsumerOptions(Config{});
  const int deliveries = o.max_attempts > 0 ? o.max_attempts : 1;
  int64_t between = 0, d = o.backoff_base_ms;
  for (int i = 1; i < deliveries; ++i, d = std::min(o.backoff_max_ms, 2 * d)) between += std::min(d, o.backoff_max_ms) * 5 / 4;
  return deliveries * (kClientAttempts - 1) * kClientBackoffMaxMs + between;
}

// The range the provider's lease is drawn from at each (re)start: from
// below the budget (a retry may take a key over while its first request
// still runs) to well above it (a key held by a killed provider stays in
// progress longer than any consumer retries: the consumers must keep
// redelivering it as in progress, never count it), short enough that a
// run still drains in CI time.
int64_t ProviderLeaseMinMs() { return std::max<int64_t>(50, ConsumerRetryBudgetMs() / 2); }
int64_t ProviderLeaseMaxMs() { return std::max<int64_t>(2'000, 2 * ConsumerRetryBudgetMs()); }

std::string ProviderStore(const Config& cfg) {
  // The provider's durability is its own: WAL without an fsync per commit
  // survives its kills (only a power cut would not).
  return cfg.provider_store.empty() ? "sqlite:" + cfg.dir + "/provider.db?synchronous=normal" : cfg.provider_store;
}


int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool IsPostgres(const std::string& url) { return cli::IsPostgresUrl(url); }

// The entries of `dir` (std::filesystem's error_code overloads throughout:
// nothing here may throw).
Result<std::vector<std::filesystem::path>> ListDir(const std::string& dir) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    out.push_back(it->path());
  if (ec) return Status::Unavailable("cannot list " + dir + ": " + ec.message());
  return out;
}

Status RemoveFile(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  if (ec) return Status::Unavailable("cannot remove " + path + ": " + ec.message());
  return Status::OK();
}

// The run starts on an empty embedded queue (what an earlier run left would
// count as unexpected effects), so it deletes the queue file of `url` and
// its -wal and -shm. Only what is certainly an embedded queue file -- or
// nothing at all -- is deleted; anything else there is refused
// (kInvalidArgument naming the path and why) and left as it is.
Status ResetEmbeddedQueue(const std::string& url) {
  IDEM_ASSIGN_OR_RETURN(embedded::QueueOptions o, embedded::Queue::ParseUrl(url));
  const std::string& path = o.path;
  auto refuse = [&](const std::string& why) {
    return Status::InvalidArgument("--source: will not delete " + path + ": " + why +
                                   " (chaos starts from an empty queue: give it an embedded queue file to reset, or a "
                                   "path where nothing is)");
  };
  auto size_of = [](const std::string& p) -> int64_t {  // -1: absent
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) return refuse(std::string("cannot examine it: ") + std::strerror(errno));
    // Nothing there. A -wal or -shm without its database is not ours to judge.
    for (const char* suffix : {"-wal", "-shm"})
      if (size_of(path + suffix) >= 0) return refuse("it does not exist, but " + path + suffix + " does");
    return Status::OK();
  }
  if (S_ISDIR(st.st_mode)) return refuse("it is a directory, not an embedded queue file");
  if (!S_ISREG(st.st_mode)) return refuse("it is not a regular file");
  if (st.st_size == 0) return refuse("it is an empty file, not an embedded queue file");
  // A queue file is a SQLite database in WAL mode (opening anything else as a
  // queue could change it: the journal mode, or a queue schema created in
  // an empty database).
  unsigned char header[100] = {};
  {
    std::ifstream in(path, std::ios::binary);
    in.read(reinterpret_cast<char*>(header), sizeof header);
    if (!in || std::memcmp(header, "SQLite format 3\0", 16) != 0)
      return refuse("it is not an embedded queue file (not a SQLite database)");
  }
  if (header[18] != 2 || header[19] != 2)
    return refuse("it is not an embedded queue file (a SQLite database not in WAL mode)");
  const int64_t page = header[16] == 0 && header[17] == 1 ? 65'536 : header[16] * 256 + header[17];
  // One page and no WAL: the schema page alone, no table at all.
  if (st.st_size <= page && size_of(path + "-wal") <= 0)
    return refuse("it is an empty SQLite database, not an embedded queue file");
  {
    auto q = embedded::Queue::Open(o);
    if (!q.ok()) {
      if (q.status().code() == Code::kSchemaMismatch || q.status().code() == Code::kCorruption)
        return refuse(q.status().message());
      return q.status().WithContext("checking --source " + path);
    }
  }
  for (const char* suffix : {"", "-wal", "-shm"}) IDEM_RETURN_IF_ERROR(RemoveFile(path + suffix));
  return Status::OK();
}

std::string WithParam(const std::string& url, const std::string& kv) {
  return url + (url.find('?') == std::string::npos ? "?" : "&") + kv;
}

// ---------------------------------------------------------------- the consumer process

// Appends one line per event to the life's journal; one write(2) per line
// (O_APPEND), so a SIGKILL loses at most the line being written, and the OS
// keeps what was written (a process crash is not a power cut).
class Journal {
 public:
  explicit Journal(const std::string& path) : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {}
  ~Journal() {
    if (fd_ >= 0) ::close(fd_);
  }
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;
  bool ok() const { return fd_ >= 0; }
  void Line(char event, const std::string& id) {
    std::string line;
    line.reserve(id.size() + 3);
    line += event;
    line += ' ';
    line += id;
    line += '\n';
    if (::write(fd_, line.data(), line.size()) < 0) {
      // Nothing to do: the check counts what the journal holds.
    }
  }

 private:
  int fd_;
};

std::atomic<bool> g_stop{false};
// The parent: SIGINT or SIGTERM stops the run, its processes and reports.
std::atomic<bool> g_interrupted{false};

// The mistakes the pattern exists to prevent, made on purpose (--broken):
// the run must then report lost or duplicated effects.
int BrokenWorker(const Config& cfg, Source& source, Store& store, Inbox& inbox, const Handler& handler) {
  struct sigaction sa{};
  sa.sa_handler = [](int) { g_stop = true; };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  while (!g_stop) {
    auto got = source.Receive(1, 100);
    if (!got.ok()) continue;
    for (const Delivery& d : *got) {
      if (cfg.broken == "no-guard") {
        // The effect alone, then the ack: a redelivery applies it again.
        auto tx = store.Begin();
        if (!tx.ok() || !handler(**tx, d.message).ok() || !(*tx)->Commit().ok()) {
          (void)source.Nack(d, 10);
          continue;
        }
        (void)source.Ack(d);
      } else {
        // Acknowledged first: a crash before the commit loses the message.
        (void)source.Ack(d);
        (void)inbox.Handle(d.message, handler);
      }
    }
  }
  return kExitOk;
}

int Worker(const Config& cfg) {
  const std::string name = std::to_string(cfg.slot) + "-" + std::to_string(cfg.life);
  Journal journal(cfg.dir + "/journal/" + name + ".log");
  if (!journal.ok()) {
    std::cerr << "chaos consumer " << name << ": cannot open its journal in " << cfg.dir << "/journal\n";
    return kExitError;
  }
  auto opened = OpenSource(cfg.source, {.lease_ms = cfg.lease_ms, .consumer = "chaos-" + std::to_string(cfg.slot)});
  if (!opened.ok()) {
    std::cerr << "chaos consumer " << name << ": " << opened.status() << "\n";
    return kExitError;
  }
  auto store = OpenStore(cfg.store, true, 2);
  if (!store.ok()) {
    std::cerr << "chaos consumer " << name << ": " << store.status() << "\n";
    return kExitError;
  }
  // Faults the fault VFS fired in this life, journalled as they happen (a
  // kill may lose the last one: the count is a lower bound).
  std::atomic<bool> done{false};
  std::thread fault_watch;
  if (std::getenv(sqlite::FaultVfs::kEnvVar) != nullptr) {
    fault_watch = std::thread([&journal, &done] {
      auto vfs = sqlite::FaultVfs::Install();
      int64_t seen = 0;
      while (vfs.ok() && !done) {
        for (int64_t n = (*vfs)->counters().faults; seen < n; ++seen) journal.Line('F', std::to_string(seen + 1));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  struct JoinAtEnd {
    std::atomic<bool>& done;
    std::thread& t;
    ~JoinAtEnd() {
      done = true;
      if (t.joinable()) t.join();
    }
  } join_at_end{done, fault_watch};
  FaultySource source(*opened->source, cfg.seed * 7919 + static_cast<uint64_t>(cfg.slot) * 131 + static_cast<uint64_t>(cfg.life),
                      cfg.lost_ack_rate, cfg.stall_rate, cfg.lease_ms + 200);
  source.on_event = [&journal](char e, const Delivery& d) { journal.Line(e, d.message.id); };
  ThreadClients clients(cfg.provider, kClientAttempts);
  auto inbox_owned = Inbox::Open(**store, Inbox::Options{.consumer = kConsumer});
  if (!inbox_owned.ok()) { std::cerr << "chaos consumer " << name << ": " << inbox_owned.status() << "\n"; return kExitError; }
  Inbox& inbox = **inbox_owned;
  Handler handler = [&](Transaction& tx, const Message& m) -> Status {
    IDEM_ASSIGN_OR_RETURN(http::Client * client, clients.Get());
    auto c = Charge(*client, m);
    // The client gave up (409s while the provider holds the key, 5xx,
    // connection errors): the charge may have been made and is not
    // finished, so the message is in progress -- redelivered, no failure
    // counted -- not failed. Counted, it would be dead-lettered (lost) once
    // the provider's lease outlasts the consumer's retry budget.
    if (!c.ok() && c.status().code() == Code::kUnavailable) return Status::InDoubt(c.status().message());
    if (!c.ok()) return c.status();
    return InsertPayment(tx, m, c->charge_id, kTable);
  };
  if (!cfg.broken.empty()) return BrokenWorker(cfg, source, **store, inbox, handler);
  auto consumer_owned = Consumer::Open(source, inbox, handler, ChaosConsumerOptions(cfg));
  if (!consumer_owned.ok()) { std::cerr << "chaos consumer " << name << ": " << consumer_owned.status() << "\n"; return kExitError; }
  Consumer& consumer = **consumer_owned;
  StopOnSignals(&consumer);
  Status s = consumer.Run();
  StopOnSignals(nullptr);
  if (!s.ok()) {
    std::cerr << "chaos consumer " << name << ": " << s << "\n";
    return kExitError;
  }
  return kExitOk;
}

// ---------------------------------------------------------------- processes

std::string SelfExe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : p.string();
}

// Starts `argv` with stdout and stderr appended to `log`, stdin from
// /dev/null, and the environment of this process minus the fault settings,
// plus `env`.
Result<pid_t> Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& log) {
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv(*e);
    if (kv.starts_with("IDEM_KILL_AT=") || kv.starts_with("IDEM_FAULT_VFS=")) continue;
    envs.emplace_back(kv);
  }
  envs.insert(envs.end(), env.begin(), env.end());
  std::vector<char*> av, ev;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  for (const auto& e : envs) ev.push_back(const_cast<char*>(e.c_str()));
  ev.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, av[0], &fa, nullptr, av.data(), ev.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return Status::Unavailable("cannot start " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

// A port that is free now, for a server the run restarts many times on the
// same port. It lies below Linux's ephemeral range (32768-60999): no
// outgoing connection -- not even a client's connect to this very port
// while nothing listens, which can connect a socket to itself -- can hold
// it when the server comes back.
Result<int> FreePort() {
  constexpr int kLow = 28'000, kHigh = 32'700;
  std::mt19937 rng(static_cast<unsigned>(::getpid()) * 2654435761u ^ static_cast<unsigned>(SteadyMs()));
  const int start = kLow + static_cast<int>(rng() % (kHigh - kLow));
  for (int i = 0; i < kHigh - kLow; ++i) {
    const int port = kLow + (start - kLow + i) % (kHigh - kLow);
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::Unavailable("socket: " + std::string(std::strerror(errno)));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (free) return port;
  }
  return Status::Unavailable("no free port on 127.0.0.1 in " + std::to_string(kLow) + "-" + std::to_string(kHigh));
}

bool ProviderHealthy(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(0, 200'000);
  c.set_read_timeout(1, 0);
  auto r = c.Get("/health");
  return r && r->status == 200;
}

// ---------------------------------------------------------------- the schedule

// Where a consumer life dies, or what breaks in it.
struct Plan {
  std::string kill_point;  // IDEM_KILL_AT value ("name:hit"), or ""
  std::string vfs;         // IDEM_FAULT_VFS value, or ""
  std::string label;       // what the summary counts it as
  int64_t kill_after_ms = 0;       // a timed SIGKILL this long after start (0: none)
  int64_t terminate_after_ms = 0;  // PostgreSQL: terminate its backends this long after start (0: none)
};

class Schedule {
 public:
  // Without the fault VFS (a build without it), SQLite runs get neither the
  // kill inside the commit nor I/O errors.
  Schedule(const Config& cfg, bool postgres, bool have_vfs)
      : cfg_(cfg), postgres_(postgres), faults_(postgres || have_vfs) {
    points_ = {"inbox.before_marker", "inbox.after_marker", "inbox.after_work", "commit",
               "inbox.after_commit", "consumer.after_ack", "inbox.batch_mid"};
    if (!faults_) points_.erase(std::find(points_.begin(), points_.end(), "commit"));
    // A store that checkpoints on its own thread: that thread dies too.
    if (!postgres) {
      auto o = sqlite::Store::ParseUrl(cfg.store);
      if (o.ok() && sqlite::Store::CheckpointsInBackground(*o)) points_.push_back("sqlite.checkpoint");
    }
    for (int s = 0; s < cfg.consumers; ++s) {
      rngs_.emplace_back(cfg.seed * 1'000'003ULL + static_cast<uint64_t>(s) * 7'919ULL + 1);
      next_point_[s] = static_cast<size_t>(s);  // the slots start at different points
    }
    provider_rng_.seed(cfg.seed * 1'000'003ULL + 999'983ULL);
  }

  // The next life of consumer `slot`, while the chaos lasts.
  Plan Next(int slot) {
    std::mt19937_64& rng = rngs_[static_cast<size_t>(slot)];
    const bool batch = slot % 2 == 1 && cfg_.batch > 1;
    Plan p;
    const double roll = std::uniform_real_distribution<double>(0, 1)(rng);
    if (faults_ && roll < cfg_.fault_rate) {
      if (postgres_) {
        p.terminate_after_ms = 20 + static_cast<int64_t>(rng() % 400);
        p.label = "fault:postgres-backend-terminated";
      } else {
        // An I/O error (or a full disk) on the store's write path (writes,
        // syncs, truncates of the database, WAL and journal), transient (the
        // next try works) or persistent (until the life's kill). The
        // operation's number sweeps 1..kSweep over each slot's fault lives of
        // each kind,
        // counted from the life's first store open, so a long run fails
        // every operation of the write path of the first transactions.
        const int64_t k = faults_given_[slot]++;
        static const char* const kKinds[][2] = {{"fail", "transient"}, {"fail", "persistent"}, {"full", "transient"}};
        const auto& kind = kKinds[k % 3];
        const int op = 1 + static_cast<int>((k / 3 * 37) % kSweep);  // 37 and kSweep coprime: every number
        p.vfs = std::string(kind[0]) + ":any:" + std::to_string(op) + ":" + kind[1];
        p.label = std::string("fault:sqlite-") + (kind[0] == std::string("full") ? "disk-full-" : "io-error-") + kind[1];
      }
      // The life then ends by a kill too, so a slot never stays in one life.
      p.kill_after_ms = 300 + static_cast<int64_t>(rng() % 700);
      return p;
    }
    if (roll < cfg_.fault_rate + 0.15) {
      p.kill_after_ms = 10 + static_cast<int64_t>(rng() % static_cast<uint64_t>(60 * cfg_.hits));
      p.label = "kill:timed";
      return p;
    }
    // Kill points in turn, so every one is hit about as often.
    std::string point;
    do {
      point = points_[next_point_[slot]++ % points_.size()];
    } while (point == "inbox.batch_mid" && !batch);
    const int hit = 1 + static_cast<int>(rng() % static_cast<uint64_t>(cfg_.hits));
    p.label = "kill:" + point;
    if (point == "commit") {
      if (postgres_) {
        p.kill_point = "postgres.commit_sent:" + std::to_string(hit);
        p.label = "kill:postgres.commit_sent";
      } else {
        p.vfs = "kill:sync:" + std::to_string(hit);
        p.label = "kill:sqlite.inside_commit";
      }
    } else {
      p.kill_point = point + ":" + std::to_string(hit);
    }
    // A life whose point is never reached (idle) still ends.
    p.kill_after_ms = 3'000 + 250 * cfg_.hits + static_cast<int64_t>(rng() % 2'000);
    return p;
  }

  // The provider's next lease, drawn at each (re)start.
  int64_t NextProviderLeaseMs() {
    const int64_t lo = ProviderLeaseMinMs(), hi = ProviderLeaseMaxMs();
    return lo + static_cast<int64_t>(provider_rng_() % static_cast<uint64_t>(hi - lo + 1));
  }

  // The provider's next life: it dies at one of its kill points.
  std::string NextProviderPoint() {
    const bool group = cfg_.provider_mode == "group-commit";
    const char* point = provider_rng_() % 2 == 0 ? (group ? "http.group_before_commit" : "http.after_claim")
                                                 : (group ? "http.group_after_commit" : "http.before_complete");
    return std::string(point) + ":" + std::to_string(20 + provider_rng_() % 200);
  }

 private:
  const Config& cfg_;
  bool postgres_;
  bool faults_;
  std::vector<std::string> points_;
  std::vector<std::mt19937_64> rngs_;
  std::map<int, size_t> next_point_;
  std::map<int, int64_t> faults_given_;
  static constexpr int64_t kSweep = 150;
  std::mt19937_64 provider_rng_;
};

// ---------------------------------------------------------------- the run

struct Life {
  int slot = -1;  // -1: the provider
  int64_t life = 0;
  pid_t pid = 0;
  Plan plan;
  int64_t started_ms = 0;
  bool killed_by_us = false;
  bool terminated = false;
};

struct Counts {
  std::map<std::string, int64_t> kills;   // by kill point or "kill:timed"
  std::map<std::string, int64_t> faults;  // by kind
  int64_t total_kills = 0;
  int64_t consumer_errors = 0;  // consumer lives that exited with an error
  int64_t provider_restarts = 0;
};

class Run {
 public:
  Run(const Config& cfg, bool have_vfs) : cfg_(cfg), postgres_(IsPostgres(cfg.store)), have_vfs_(have_vfs), schedule_(cfg, postgres_, have_vfs) {}

  Status Prepare();
  Status Go();
  int Report();

 private:
  Status StartConsumer(int slot, bool chaos);
  Status StartProvider(bool chaos);
  void Reap();
  void Ended(pid_t pid, int status);
  void Produce();
  Result<int64_t> Applied();
  void TerminateBackends(const Life& l);
  void StopAll();

  const Config& cfg_;
  const bool postgres_;
  const bool have_vfs_;
  Schedule schedule_;
  std::string exe_ = SelfExe();
  std::string source_url_;  // what the consumers open
  std::string provider_url_;
  int provider_port_ = 0;
  OpenedSource producer_;
  std::unique_ptr<Store> store_;
  // PostgreSQL: the consumers reach the server through this proxy, which
  // cuts the network to it now and then.
  std::unique_ptr<CutProxy> proxy_;
  std::string consumer_store_;
  std::mt19937_64 net_rng_;
  int64_t next_cut_ms_ = 0;
  int64_t restarts_done_ = 0;
  std::map<pid_t, Life> lives_;
  std::vector<int64_t> next_life_;
  std::vector<bool> slot_busy_;
  bool provider_up_ = false;
  int64_t provider_lives_ = 0;
  std::vector<int64_t> provider_leases_ms_;  // each provider life's --lease, in order
  Counts counts_;
  std::atomic<bool> produced_{false};
  std::atomic<int64_t> published_{0};
  std::atomic<int64_t> publish_retries_{0};
  Status produce_status_;
  double seconds_ = 0;
  int64_t last_applied_ = 0;
  bool kills_reached_ = false;
  bool drained_ = false;
};

Status Run::Prepare() {
  std::error_code ec;
  // A run deletes its own files from the work directory before it starts:
  // only from one it made (it leaves a mark), never a user's provider.db.
  const std::string mark = cfg_.dir + "/.idem-chaos";
  if (!std::filesystem::exists(mark, ec)) {
    for (const char* name : {"oracle.log", "provider.db", "provider.log", "journal"})
      if (std::filesystem::exists(cfg_.dir + "/" + name, ec))
        return Status::InvalidArgument("--dir " + cfg_.dir + " holds " + name +
                                       ", which idem chaos did not make: give a new or empty directory");
  }
  std::filesystem::create_directories(cfg_.dir + "/journal", ec);
  if (ec) return Status::Unavailable("cannot create " + cfg_.dir + "/journal: " + ec.message());
  if (FILE* f = std::fopen(mark.c_str(), "w")) {
    std::fputs("a work directory of idem chaos: a later run may delete its files\n", f);
    std::fclose(f);
  } else {
    return Status::Unavailable("cannot write " + mark + ": " + std::strerror(errno));
  }
  IDEM_ASSIGN_OR_RETURN(auto journals, ListDir(cfg_.dir + "/journal"));
  for (const auto& p : journals) IDEM_RETURN_IF_ERROR(RemoveFile(p.string()));
  for (const char* name : {"oracle.log", "provider.db", "provider.db-wal", "provider.db-shm", "provider.log"})
    IDEM_RETURN_IF_ERROR(RemoveFile(cfg_.dir + "/" + name));
  // The producer's side of the source. A Kafka group member the parent
  // never polls would hold partitions, so that one goes (elsewhere the
  // publisher is the source itself, or the source holds nothing).
  IDEM_ASSIGN_OR_RETURN(producer_, OpenSource(cfg_.source, {.lease_ms = cfg_.lease_ms, .consumer = "chaos-producer"}));
  if (producer_.kind.starts_with("kafka")) producer_.source.reset();
  source_url_ = producer_.shared_url;
  // The store: the effect table and the markers start empty.
  IDEM_ASSIGN_OR_RETURN(store_, OpenStore(cfg_.store, true, 2));
  {
    IDEM_ASSIGN_OR_RETURN(auto tx, store_->Begin());
    IDEM_RETURN_IF_ERROR(tx->Exec(std::string("DROP TABLE IF EXISTS ") + kTable).status());
    IDEM_RETURN_IF_ERROR(tx->Exec(CreatePaymentsSql(kTable)).status());
    IDEM_RETURN_IF_ERROR(tx->Exec("DELETE FROM idem_failures WHERE consumer = $1", {kConsumer}).status());
    IDEM_RETURN_IF_ERROR(tx->Exec("DELETE FROM idem_dead_letters WHERE consumer = $1", {kConsumer}).status());
    IDEM_RETURN_IF_ERROR(tx->Commit());
  }
  IDEM_RETURN_IF_ERROR(store_->Purge(kConsumer, INT64_MAX, 10'000).status());
  if (!cfg_.provider_store.empty()) {  // (the default's files are gone already)
    IDEM_ASSIGN_OR_RETURN(auto provider, OpenStore(cfg_.provider_store, true, 1));
    IDEM_ASSIGN_OR_RETURN(auto tx, provider->Begin());
    IDEM_RETURN_IF_ERROR(tx->Exec("DROP TABLE IF EXISTS provider_charges").status());
    // Only this run's principal: other users of the database keep theirs.
    IDEM_RETURN_IF_ERROR(
        tx->Exec("DELETE FROM idem_claims WHERE substr(scope, 1, length($1)) = $1", {std::string(kPrincipal) + "|"})
            .status());
    IDEM_RETURN_IF_ERROR(tx->Commit());
  }
  consumer_store_ = cfg_.store;
  if (postgres_) {
    std::string host;
    int target = 0;
    IDEM_RETURN_IF_ERROR(RouteThrough(cfg_.store, 1, host, target).status());
    IDEM_ASSIGN_OR_RETURN(proxy_, CutProxy::Start(host, target));
    IDEM_ASSIGN_OR_RETURN(consumer_store_, RouteThrough(cfg_.store, proxy_->port(), host, target));
    net_rng_.seed(cfg_.seed * 1'000'003ULL + 424'242ULL);
  }
  IDEM_ASSIGN_OR_RETURN(provider_port_, FreePort());
  provider_url_ = "http://127.0.0.1:" + std::to_string(provider_port_);
  next_life_.assign(static_cast<size_t>(cfg_.consumers), 0);
  slot_busy_.assign(static_cast<size_t>(cfg_.consumers), false);
  return Status::OK();
}

Status Run::StartProvider(bool chaos) {
  // Drawn for every life, chaos or not, so a seed gives the same leases.
  const int64_t lease_ms = schedule_.NextProviderLeaseMs();
  provider_leases_ms_.push_back(lease_ms);
  std::vector<std::string> argv = {exe_,
                                   "provider",
                                   "--listen",
                                   "127.0.0.1:" + std::to_string(provider_port_),
                                   "--store",
                                   ProviderStore(cfg_),
                                   "--api-key",
                                   std::string(kApiKey) + ":" + kPrincipal,
                                   "--lease",
                                   std::to_string(lease_ms) + "ms",
                                   "--lose-responses",
                                   std::to_string(cfg_.lost_response_rate),
                                   "--seed",
                                   std::to_string(cfg_.seed),
                                   "--max-keys",
                                   std::to_string(std::max<int64_t>(100'000, 2 * cfg_.messages))};
  if (cfg_.provider_mode == "group-commit") argv.insert(argv.end(), {"--one-transaction", "--group-commit", "64"});
  Life l;
  l.life = provider_lives_++;
  if (chaos) {
    l.plan.kill_point = schedule_.NextProviderPoint();
    l.plan.label = "kill:" + l.plan.kill_point.substr(0, l.plan.kill_point.find(':'));
  }
  std::vector<std::string> env;
  if (!l.plan.kill_point.empty()) env.push_back("IDEM_KILL_AT=" + l.plan.kill_point);
  IDEM_ASSIGN_OR_RETURN(l.pid, Spawn(argv, env, cfg_.dir + "/provider.log"));
  l.started_ms = SteadyMs();
  // It serves within a moment; until then the consumers' calls fail and are
  // retried, which is part of the test.
  lives_[l.pid] = l;
  provider_up_ = true;
  for (int i = 0; i < 100 && !ProviderHealthy(provider_port_); ++i) {
    int st = 0;
    if (::waitpid(l.pid, &st, WNOHANG) == l.pid) {
      // Killed at its kill point by a consumer's first call, before it
      // answered the health check: a death like any other (restarted).
      if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
        Ended(l.pid, st);
        return Status::OK();
      }
      lives_.erase(l.pid);
      provider_up_ = false;
      return Status::Unavailable("the provider exited at start; see " + cfg_.dir + "/provider.log");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Status::OK();
}

Status Run::StartConsumer(int slot, bool chaos) {
  Life l;
  l.slot = slot;
  l.life = next_life_[static_cast<size_t>(slot)]++;
  if (chaos) l.plan = schedule_.Next(slot);
  std::string store = consumer_store_;
  if (postgres_) {
    store = WithParam(store, "application_name=idem-chaos-" + std::to_string(slot) + "-" + std::to_string(l.life));
  } else if (!l.plan.vfs.empty()) {
    store = WithParam(store, "vfs=idem-fault");
  }
  std::vector<std::string> argv = {exe_,        "chaos",         "--worker",  std::to_string(slot),
                                   "--life",    std::to_string(l.life), "--dir", cfg_.dir,
                                   "--source",  source_url_,   "--store",   store,
                                   "--provider", provider_url_, "--seed",   std::to_string(cfg_.seed),
                                   "--batch",   std::to_string(cfg_.batch), "--lease-ms", std::to_string(cfg_.lease_ms),
                                   "--lost-ack-rate", std::to_string(cfg_.lost_ack_rate),
                                   "--stall-rate", std::to_string(cfg_.stall_rate)};
  if (!cfg_.broken.empty()) argv.insert(argv.end(), {"--broken", cfg_.broken});
  std::vector<std::string> env;
  if (!l.plan.kill_point.empty()) env.push_back("IDEM_KILL_AT=" + l.plan.kill_point);
  if (!l.plan.vfs.empty()) env.push_back("IDEM_FAULT_VFS=" + l.plan.vfs);
  IDEM_ASSIGN_OR_RETURN(l.pid, Spawn(argv, env, cfg_.dir + "/consumer-" + std::to_string(slot) + ".log"));
  l.started_ms = SteadyMs();
  if (l.plan.label.starts_with("fault:")) ++counts_.faults[l.plan.label.substr(6)];
  slot_busy_[static_cast<size_t>(slot)] = true;
  lives_[l.pid] = l;
  return Status::OK();
}

// Collects the processes that ended and counts how.
void Run::Reap() {
  int st = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &st, WNOHANG)) > 0) Ended(pid, st);
}

// Counts how a process of the run ended (its status from waitpid).
void Run::Ended(pid_t pid, int st) {
  auto it = lives_.find(pid);
  if (it == lives_.end()) return;
  const Life l = it->second;
  lives_.erase(it);
  if (l.slot < 0) {
    provider_up_ = false;
  } else {
    slot_busy_[static_cast<size_t>(l.slot)] = false;
  }
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) {
    ++counts_.total_kills;
    // Killed by the schedule's timer, or by itself at its kill point.
    std::string what = l.killed_by_us ? (l.plan.label.starts_with("fault:") ? l.plan.label + " (then killed)" : "kill:timed")
                                      : l.plan.label;
    if (l.slot < 0) what = "provider " + what;
    ++counts_.kills[what.empty() ? "kill:unplanned" : what];
  } else if (l.slot >= 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
    ++counts_.consumer_errors;
  }
}

void Run::Produce() {
  std::mt19937_64 rng(cfg_.seed);
  std::ofstream oracle(cfg_.dir + "/oracle.log");
  // In the oracle before it is published: the oracle holds every message
  // that may reach a consumer. A failed publication (a broker restarting) is
  // retried as a producer would, on a fresh connection: when the first
  // attempt's outcome was unknown, that is a producer duplicate.
  auto publish = [&](const Message& m) -> Status {
    Status s;
    // For 2 minutes, however long a reopening waits for the broker.
    const int64_t deadline = SteadyMs() + 120'000;
    for (int attempt = 0; (attempt == 0 || SteadyMs() < deadline) && !g_interrupted; ++attempt) {
      oracle << m.id << " " << m.payload << "\n" << std::flush;
      s = producer_.publish(m);
      if (s.ok()) {
        ++published_;
        return s;
      }
      ++publish_retries_;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      auto reopened = OpenSource(cfg_.source, {.lease_ms = cfg_.lease_ms, .consumer = "chaos-producer"});
      if (reopened.ok()) {
        if (reopened->kind.starts_with("kafka")) reopened->source.reset();
        producer_ = std::move(*reopened);  // only this thread uses it until the run ends
      }
    }
    return s.WithContext("publishing " + m.id + " failed for 2 minutes");
  };
  std::vector<Message> again;
  for (int64_t i = 0; i < cfg_.messages && produce_status_.ok(); ++i) {
    const int64_t cents = 100 + static_cast<int64_t>(rng() % 99'900);
    std::string order = "o";  // (built in steps: g++ 12 warns falsely on "o" + to_string)
    order += std::to_string(i);
    Message m = PaymentMessage("pay-" + std::to_string(cfg_.seed) + "-" + std::to_string(i), order, cents);
    produce_status_ = publish(m);
    if (std::uniform_real_distribution<double>(0, 1)(rng) < cfg_.dup_rate) again.push_back(m);
  }
  // The producer's retries: the same facts published again.
  for (const Message& m : again) {
    if (!produce_status_.ok()) break;
    produce_status_ = publish(m);
  }
  produced_ = true;
}

// Progress: the markers (a plain read, which never waits for the consumers'
// write lock on SQLite), or, for a broken consumer that writes none, the
// effect rows.
Result<int64_t> Run::Applied() {
  if (cfg_.broken != "no-guard") return store_->CountMarkers(kConsumer);
  IDEM_ASSIGN_OR_RETURN(auto tx, store_->Begin());
  IDEM_ASSIGN_OR_RETURN(Rows r, tx->Query(std::string("SELECT count(DISTINCT message_id) FROM ") + kTable));
  return r.rows[0][0].AsInt();
}

void Run::TerminateBackends(const Life& l) {
  auto tx = store_->Begin();
  if (!tx.ok()) return;
  (void)(*tx)->Query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
                     {"idem-chaos-" + std::to_string(l.slot) + "-" + std::to_string(l.life)});
}

void Run::StopAll() {
  for (auto& [pid, l] : lives_) ::kill(pid, SIGTERM);
  const int64_t deadline = SteadyMs() + 10'000;
  while (!lives_.empty() && SteadyMs() < deadline) {
    int st = 0;
    pid_t pid = ::waitpid(-1, &st, WNOHANG);
    if (pid > 0) {
      lives_.erase(pid);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  for (auto& [pid, l] : lives_) {
    ::kill(pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
  }
  lives_.clear();
}

Status Run::Go() {
  const int64_t started = SteadyMs();
  IDEM_RETURN_IF_ERROR(StartProvider(/*chaos=*/true));
  std::thread producer([this] { Produce(); });
  Progress progress("chaos", cfg_.messages);
  bool chaos = true;
  int64_t last_poll = 0, last_progress_ms = SteadyMs(), poll_every_ms = 200;
  Status failure;
  struct sigaction sa{};
  sa.sa_handler = [](int) { g_interrupted = true; };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  while (!g_interrupted) {
    Reap();
    const int64_t now = SteadyMs();
    if (!provider_up_) {
      ++counts_.provider_restarts;
      if (Status s = StartProvider(chaos); !s.ok()) {
        failure = s;
        break;
      }
    }
    for (int slot = 0; slot < cfg_.consumers; ++slot) {
      if (slot_busy_[static_cast<size_t>(slot)]) continue;
      if (Status s = StartConsumer(slot, chaos); !s.ok()) {
        failure = s;
        break;
      }
    }
    if (!failure.ok()) break;
    for (auto& [pid, l] : lives_) {
      if (l.plan.kill_after_ms > 0 && !l.killed_by_us && now - l.started_ms >= l.plan.kill_after_ms) {
        ::kill(pid, SIGKILL);
        l.killed_by_us = true;
      }
      if (l.plan.terminate_after_ms > 0 && !l.terminated && now - l.started_ms >= l.plan.terminate_after_ms) {
        l.terminated = true;
        TerminateBackends(l);
      }
    }
    if (chaos && !cfg_.restart_cmd.empty() && restarts_done_ < cfg_.restarts &&
        counts_.total_kills >= (restarts_done_ + 1) * cfg_.kills / (cfg_.restarts + 1)) {
      // A broker (or database) restart; the consumers see it go and come
      // back. The run pauses meanwhile (nothing is reaped or killed).
      ++restarts_done_;
      const int rc = std::system(cfg_.restart_cmd.c_str());
      if (rc != 0) {
        failure = Status::Unavailable("--restart-cmd failed (status " + std::to_string(rc) + "): " + cfg_.restart_cmd);
        break;
      }
      ++counts_.faults["restart"];
    }
    if (proxy_ != nullptr && chaos && now >= next_cut_ms_) {
      // A network cut between the consumers and PostgreSQL: every
      // connection reset, new ones refused for a moment.
      if (next_cut_ms_ > 0) proxy_->Cut(50 + static_cast<int64_t>(net_rng_() % 350));
      next_cut_ms_ = now + 300 + static_cast<int64_t>(net_rng_() % 1'200);
    }
    if (now - last_poll >= poll_every_ms) {
      last_poll = now;
      auto applied = Applied();
      // Counting a million markers takes a while: poll at most 10% of the time.
      poll_every_ms = std::max<int64_t>(200, 10 * (SteadyMs() - now));
      if (applied.ok()) {
        if (*applied != last_applied_) last_progress_ms = now;
        last_applied_ = *applied;
        progress.Update(last_applied_);
      }
      if (produced_ && last_applied_ >= cfg_.messages) {
        drained_ = true;
        break;  // every effect is in; a shortfall of kills is reported
      }
      if (now - last_progress_ms > cfg_.drain_timeout_ms) {
        if (!chaos) break;  // what is missing is reported as lost
        // No progress under fire: stop breaking things and drain calmly
        // (lives already armed still end as planned).
        chaos = false;
        last_progress_ms = now;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  progress.Done();
  kills_reached_ = counts_.total_kills >= cfg_.kills;
  StopAll();
  producer.join();
  seconds_ = static_cast<double>(SteadyMs() - started) / 1000.0;
  IDEM_RETURN_IF_ERROR(failure);
  return produce_status_;
}

// ---------------------------------------------------------------- the check

struct Check {
  int64_t published = 0, unique = 0, deliveries = 0, applied = 0, lost = 0, duplicated = 0, unexpected = 0;
  int64_t provider_charges = 0, provider_duplicated = 0, provider_unexpected = 0, provider_missing = 0;
  int64_t acked_not_committed = 0, effects_without_charge = 0, lost_acks = 0, stalls = 0, lost_responses = 0;
  int64_t effect_rows = 0, expected_cents = 0, charged_cents = 0;
  int64_t vfs_faults_fired = 0;  // I/O errors and full disks the fault VFS returned
  std::vector<std::string> examples;  // a few ids per problem, for the report
};

Result<Check> CheckEffects(const Config& cfg, Store& store) {
  Check c;
  std::unordered_map<std::string, std::string> oracle;  // id -> payload
  std::unordered_map<std::string, std::string> by_order;  // order -> id
  {
    std::ifstream in(cfg.dir + "/oracle.log");
    std::string id, payload;
    while (in >> id >> payload) {
      ++c.published;
      if (oracle.emplace(id, payload).second) {
        Message m;
        m.id = id;
        m.payload = payload;
        auto p = ParsePayment(m);
        if (!p.ok()) return p.status();
        by_order[p->first] = id;
        c.expected_cents += p->second;
      }
    }
  }
  c.unique = static_cast<int64_t>(oracle.size());
  auto example = [&c](const std::string& what, const std::string& id) {
    if (c.examples.size() < 20) c.examples.push_back(what + " " + id);
  };
  // Effects in the store under test.
  std::unordered_map<std::string, int64_t> applied;
  std::unordered_set<std::string> charge_ids;
  {
    IDEM_ASSIGN_OR_RETURN(auto tx, store.Begin());
    IDEM_ASSIGN_OR_RETURN(Rows r, tx->Query(std::string("SELECT message_id, charge_id, cents FROM ") + kTable));
    for (const auto& row : r.rows) {
      ++c.effect_rows;
      ++applied[row[0].AsText()];
      if (!row[1].is_null()) charge_ids.insert(row[1].AsText());
    }
  }
  for (const auto& [id, n] : applied) {
    if (!oracle.count(id)) {
      ++c.unexpected;
      example("unexpected", id);
    } else if (n > 1) {
      ++c.duplicated;
      example("duplicated", id);
    }
  }
  for (const auto& [id, payload] : oracle) {
    if (!applied.count(id)) {
      ++c.lost;
      example("lost", id);
    }
  }
  c.applied = static_cast<int64_t>(applied.size());
  // Effects at the provider: charges per order (its customer is "cus_<order>").
  {
    IDEM_ASSIGN_OR_RETURN(auto db, OpenStore(ProviderStore(cfg), false));
    IDEM_ASSIGN_OR_RETURN(auto tx, db->Begin());
    IDEM_ASSIGN_OR_RETURN(Rows r, tx->Query("SELECT id, customer, amount FROM provider_charges"));
    std::unordered_map<std::string, int64_t> per_order;
    std::unordered_set<std::string> made;
    for (const auto& row : r.rows) {
      ++c.provider_charges;
      c.charged_cents += row[2].AsInt();
      made.insert(row[0].AsText());
      std::string order = row[1].AsText();
      if (order.starts_with("cus_")) order = order.substr(4);
      ++per_order[order];
    }
    for (const auto& [order, n] : per_order) {
      if (!by_order.count(order)) {
        ++c.provider_unexpected;
        example("provider-unexpected", order);
      } else if (n > 1) {
        ++c.provider_duplicated;
        example("provider-duplicated", by_order[order]);
      }
    }
    for (const auto& [order, id] : by_order)
      if (!per_order.count(order)) ++c.provider_missing;
    for (const auto& id : charge_ids)
      if (!made.count(id)) {
        ++c.effects_without_charge;
        example("charge-missing", id);
      }
  }
  // What the consumers acknowledged, from their journals.
  std::unordered_set<std::string> acked;
  IDEM_ASSIGN_OR_RETURN(auto journals, ListDir(cfg.dir + "/journal"));
  for (const auto& journal : journals) {
    std::ifstream in(journal);
    std::string line;
    while (std::getline(in, line)) {
      if (line.size() < 3) continue;  // a line cut by a kill
      const std::string id = line.substr(2);
      switch (line[0]) {
        case 'R': ++c.deliveries; break;
        case 'S': ++c.stalls; break;
        case 'L': ++c.lost_acks; acked.insert(id); break;
        case 'A': acked.insert(id); break;
        case 'F': ++c.vfs_faults_fired; break;
        default: break;
      }
    }
  }
  for (const auto& id : acked)
    if (!applied.count(id)) {
      ++c.acked_not_committed;
      example("acked-not-committed", id);
    }
  {
    std::ifstream in(cfg.dir + "/provider.log");
    std::string line;
    while (std::getline(in, line))
      if (line.find("outcome=response-dropped") != std::string::npos) ++c.lost_responses;
  }
  return c;
}

std::string JsonCounts(const std::map<std::string, int64_t>& m) {
  Json j;
  for (const auto& [k, v] : m) j.Add(k, v);
  return j.str();
}

int Run::Report() {
  auto checked = CheckEffects(cfg_, *store_);
  if (!checked.ok()) return Fail("chaos", checked.status());
  const Check& c = *checked;
  // SQLite faults count when the VFS returned them, not when armed (a life
  // may die or finish before its operation comes).
  int64_t faults = c.lost_acks + c.stalls + c.lost_responses + c.vfs_faults_fired;
  if (proxy_ != nullptr) {
    counts_.faults["network-cut"] = proxy_->cuts();
    counts_.faults["network-cut-connections-reset"] = proxy_->connections_reset();
  }
  for (const auto& [k, v] : counts_.faults)
    if (!k.starts_with("sqlite-") && k != "network-cut-connections-reset") faults += v;
  const bool effects_ok = c.lost == 0 && c.duplicated == 0 && c.unexpected == 0 && c.provider_duplicated == 0 &&
                          c.provider_unexpected == 0 && c.provider_missing == 0 && c.acked_not_committed == 0 &&
                          c.effects_without_charge == 0 && c.applied == c.unique && c.effect_rows == c.unique &&
                          c.provider_charges == c.unique && c.charged_cents == c.expected_cents;
  const bool interrupted = g_interrupted;
  const bool ok = effects_ok && kills_reached_ && !interrupted;
  if (cfg_.json) {
    Json j;
    j.Add("published", c.published)
        .Add("unique", c.unique)
        .Add("deliveries", c.deliveries)
        .Add("kills", counts_.total_kills)
        .Add("kills_requested", cfg_.kills)
        .AddRaw("kills_by_point", JsonCounts(counts_.kills))
        .Add("faults", faults)
        .AddRaw("faults_by_kind", JsonCounts([&] {
                  std::map<std::string, int64_t> m;
                  for (const auto& [k, v] : counts_.faults) m[k.starts_with("sqlite-") ? k + "-armed" : k] = v;
                  m["lost-ack"] = c.lost_acks;
                  m["lease-expiry-stall"] = c.stalls;
                  m["lost-provider-response"] = c.lost_responses;
                  m["sqlite-faults-fired"] = c.vfs_faults_fired;
                  return m;
                }()))
        .Add("applied", c.applied)
        .Add("lost", c.lost)
        .Add("duplicated", c.duplicated + c.provider_duplicated)
        .Add("unexpected", c.unexpected + c.provider_unexpected)
        .Add("acked_not_committed", c.acked_not_committed)
        .Add("provider_charges", c.provider_charges)
        .Add("provider_missing", c.provider_missing)
        .Add("consumer_errors", counts_.consumer_errors)
        .Add("provider_restarts", counts_.provider_restarts)
        .AddRaw("provider_lease_ms", [&] {
          std::vector<std::string> v;
          for (int64_t l : provider_leases_ms_) v.push_back(std::to_string(l));
          return JsonArray(v);
        }())
        .Add("provider_lease_range_ms", std::to_string(ProviderLeaseMinMs()) + ".." + std::to_string(ProviderLeaseMaxMs()))
        .Add("consumer_retry_budget_ms", ConsumerRetryBudgetMs())
        .Add("provider_leases_over_budget",
             static_cast<int64_t>(std::count_if(provider_leases_ms_.begin(), provider_leases_ms_.end(),
                                                [](int64_t l) { return l > ConsumerRetryBudgetMs(); })))
        .Add("publish_retries", publish_retries_.load())
        .Add("seconds", seconds_)
        .Add("source", producer_.kind)
        .Add("store", postgres_ ? "postgres" : "sqlite")
        .Add("interrupted", interrupted)
        .Add("ok", ok)
        .Add("seed", static_cast<int64_t>(cfg_.seed))
        .Add("dir", cfg_.dir);
    std::cout << j.str() << "\n";
  } else {
    auto row = [](const std::string& k, const std::string& v) {
      std::cout << "  " << k << std::string(k.size() < 46 ? 46 - k.size() : 1, ' ') << v << "\n";
    };
    auto mark = [](bool good) { return good ? "  ✓" : "  ✕"; };
    std::cout << "\nidem chaos: seed " << cfg_.seed << ", " << cfg_.consumers << " consumer processes on "
              << producer_.kind << " + " << (postgres_ ? "PostgreSQL" : "SQLite") << ", provider over HTTP\n\n";
    row("published (with producer retries)", std::to_string(c.published));
    row("unique messages", std::to_string(c.unique));
    row("deliveries seen by consumers", std::to_string(c.deliveries));
    row("kills (SIGKILL)", std::to_string(counts_.total_kills) + " of " + std::to_string(cfg_.kills) + " requested" +
                               mark(kills_reached_));
    for (const auto& [k, v] : counts_.kills) row("  " + k, std::to_string(v));
    row("faults injected", std::to_string(faults));
    for (const auto& [k, v] : counts_.faults)
      row("  " + k + (k.starts_with("sqlite-") ? " (lives armed)" : ""), std::to_string(v));
    row("  lost acks", std::to_string(c.lost_acks));
    row("  stalls past the lease", std::to_string(c.stalls));
    row("  lost provider responses", std::to_string(c.lost_responses));
    if (!postgres_) row("  SQLite I/O errors returned (of those armed)", std::to_string(c.vfs_faults_fired));
    row("applied (distinct messages with an effect)", std::to_string(c.applied) + mark(c.applied == c.unique));
    row("lost (published, never applied)", std::to_string(c.lost) + mark(c.lost == 0));
    row("duplicated (applied twice: store/provider)",
        std::to_string(c.duplicated) + " / " + std::to_string(c.provider_duplicated) +
            mark(c.duplicated == 0 && c.provider_duplicated == 0));
    row("unexpected (applied, never published)",
        std::to_string(c.unexpected + c.provider_unexpected) + mark(c.unexpected + c.provider_unexpected == 0));
    row("acknowledged but not committed", std::to_string(c.acked_not_committed) + mark(c.acked_not_committed == 0));
    row("provider charges", std::to_string(c.provider_charges) + mark(c.provider_charges == c.unique));
    row("charged / expected (cents)", std::to_string(c.charged_cents) + " / " + std::to_string(c.expected_cents) +
                                          mark(c.charged_cents == c.expected_cents));
    {
      std::string leases;
      int64_t over = 0;
      for (int64_t l : provider_leases_ms_) {
        leases += (leases.empty() ? "" : " ") + std::to_string(l);
        over += l > ConsumerRetryBudgetMs() ? 1 : 0;
      }
      row("provider leases (ms, per life)", leases);
      row("  above the consumers' retry budget (" + std::to_string(ConsumerRetryBudgetMs()) + " ms)",
          std::to_string(over) + " of " + std::to_string(provider_leases_ms_.size()));
    }
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f s", seconds_);
    row("time", secs);
    for (const auto& e : c.examples) std::cout << "  e.g. " << e << "\n";
    if (interrupted) std::cout << "  interrupted: the counts are of an unfinished run\n";
    if (!kills_reached_)
      std::cout << "  the messages ran out before the kills did: raise --messages or lower --kills\n";
    std::cout << (ok ? "  OK: every message's effect exactly once, in the store and at the provider\n"
                     : "  FAILED\n")
              << "  replay this schedule: idem chaos --seed " << cfg_.seed << " (files in " << cfg_.dir << ")\n";
  }
  return ok ? kExitOk : kExitCheckFailed;
}

}  // namespace

const Command& ChaosCommand() {
  static const Command c{
      "chaos",
      "Prove exactly-once effects by breaking the payments workload while it runs: consumer processes\n"
      "are SIGKILLed at random times and at every named kill point (before and after the marker,\n"
      "after the work, inside the commit, after the commit before the ack, after the ack, mid-batch)\n"
      "and restarted; the HTTP payment provider is killed while it holds a claim; faults are injected\n"
      "(lost acks, leases expiring under stalled consumers, lost provider responses, SQLite I/O errors\n"
      "through a fault VFS, PostgreSQL backends terminated). Then everything is drained and the\n"
      "effects are counted against an oracle journal kept outside every database: lost, duplicated\n"
      "(in the store or at the provider), unexpected, acknowledged-but-not-committed. Exits 0 only\n"
      "when all are 0 and every message's effect is there exactly once. Every run prints its seed;\n"
      "the same seed replays the same schedule of faults.",
      "[--source URL] [--store URL] [--messages N] [--consumers M] [--kills K] [--seed S] [--json]",
      {{"source", "URL", "embedded:DIR/queue.db",
        "the broker (see idem run --help); kafka-mock: runs the mock\n"
        "          cluster in this process for every consumer. An embedded queue\n"
        "          file is deleted first (the whole file, every queue in it); only\n"
        "          an embedded queue file or a path where nothing is is accepted:\n"
        "          anything else there (a store, another file, a directory) is\n"
        "          refused and left alone"},
       {"store", "URL", "sqlite:DIR/payments.db", "the store under test: sqlite:PATH or postgres://..."},
       {"provider-store", "URL", "sqlite:DIR/provider.db",
        "the provider's store (its claims, charges and stored responses): sqlite:PATH\n"
        "          or postgres://...; emptied of charges and claims first"},
       {"messages", "N", "3000", "unique payment messages"},
       {"consumers", "M", "4", "consumer processes"},
       {"kills", "K", "100",
        "at least this many SIGKILLs (consumers and provider); the kills and faults go\n"
        "          on until every message is applied, so more messages mean more kills"},
       {"seed", "S", "1", "seed of the schedule of kills and faults"},
       {"dir", "DIR", "", "work directory (default: a fresh temporary directory)"},
       {"dup-rate", "P", "0.05", "fraction of messages the producer publishes twice"},
       {"lost-ack-rate", "P", "0.02", "fraction of acks lost"},
       {"stall-rate", "P", "0.005", "fraction of receives that stall past the lease"},
       {"lost-response-rate", "P", "0.02", "fraction of keys whose first provider response is dropped"},
       {"fault-rate", "P", "0.15", "fraction of consumer lives given an I/O error or a terminated backend"},
       {"hits", "N", "4",
        "a kill point fires at a hit drawn from 1..N (timed kills within 60*N ms):\n"
        "          larger means longer consumer lives, fewer process starts (long runs)"},
       {"restart-cmd", "CMD", "",
        "a shell command that restarts the broker (or database) under test, e.g.\n"
        "          'scripts/test-redis.sh pause S && scripts/test-redis.sh resume S'"},
       {"restarts", "N", "2", "how many times --restart-cmd runs, spread over the kills"},
       {"lease-ms", "MS", "400", "the source's lease (visibility timeout) where it has one"},
       {"batch", "N", "8", "batch size of the odd-numbered consumers (the even ones take one at a time)"},
       {"drain-timeout", "DURATION", "60s",
        "how long without progress before the faults stop for a calm drain,\n"
        "          and then before what is missing is reported lost"},
       {"json", "", "", "print one JSON object instead of the table"},
       {"broken", "MODE", "",
        "run a deliberately broken consumer to see the check fail: no-guard (the\n"
        "          effect without its marker) or ack-before-commit"},
       {"provider-mode", "MODE", "two-phase",
        "how the provider commits a charge: two-phase (killed after a claim and\n"
        "          before a completion) or group-commit (one transaction for many\n"
        "          requests; killed before and after a group's commit)"},
       {"worker", "SLOT", "", "(internal) run as consumer SLOT"},
       {"life", "N", "0", "(internal) the consumer's life number"},
       {"provider", "URL", "", "(internal) the provider's URL"}}};
  return c;
}

int RunChaos(const Args& args) {
  const std::string cmd = "chaos";
  Config cfg;
  auto integer = [&](const char* name, int64_t& out, int64_t min, int64_t max = INT64_MAX) -> Status {
    if (!args.Has(name)) return Status::OK();
    IDEM_ASSIGN_OR_RETURN(out, args.GetInt(name));
    if (out < min)
      return Status::InvalidArgument("--" + std::string(name) + " must be at least " + std::to_string(min));
    if (out > max) return Status::InvalidArgument("--" + std::string(name) + " must be at most " + std::to_string(max));
    return Status::OK();
  };
  auto fraction = [&](const char* name, double& out) -> Status {
    if (!args.Has(name)) return Status::OK();
    char* end = nullptr;
    const std::string v = args.Get(name);
    out = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !(out >= 0 && out <= 1))
      return Status::InvalidArgument("--" + std::string(name) + " must be a fraction 0..1, got '" + v + "'");
    return Status::OK();
  };
  int64_t consumers = cfg.consumers, seed = 1, batch = cfg.batch, slot = -1;
  Status s = integer("messages", cfg.messages, 1);
  if (s.ok()) s = integer("consumers", consumers, 1);
  if (s.ok()) s = integer("kills", cfg.kills, 0);
  if (s.ok()) s = integer("seed", seed, 0);
  if (s.ok()) s = integer("batch", batch, 1);
  // (Bounded above: the schedule multiplies them.)
  if (s.ok()) s = integer("lease-ms", cfg.lease_ms, 50, 3'600'000);
  if (s.ok()) s = integer("hits", cfg.hits, 1, 1'000'000);
  if (s.ok()) s = integer("restarts", cfg.restarts, 0);
  cfg.restart_cmd = args.Has("restart-cmd") ? args.Get("restart-cmd") : "";
  if (s.ok()) s = integer("worker", slot, 0);
  if (s.ok()) s = integer("life", cfg.life, 0);
  for (auto [name, out] : {std::pair<const char*, double*>{"dup-rate", &cfg.dup_rate},
                           {"lost-ack-rate", &cfg.lost_ack_rate},
                           {"stall-rate", &cfg.stall_rate},
                           {"lost-response-rate", &cfg.lost_response_rate},
                           {"fault-rate", &cfg.fault_rate}})
    if (s.ok()) s = fraction(name, *out);
  if (s.ok() && args.Has("drain-timeout")) {
    auto d = ParseDurationMs(args.Get("drain-timeout"));
    s = d.status();
    if (d.ok()) cfg.drain_timeout_ms = *d;
  }
  if (!s.ok()) return Fail(cmd, s);
  if (consumers > 64) return Fail(cmd, Status::InvalidArgument("--consumers must be at most 64"));
  cfg.consumers = static_cast<int>(consumers);
  cfg.seed = static_cast<uint64_t>(seed);
  cfg.batch = static_cast<int>(std::min<int64_t>(batch, 1000));
  cfg.slot = static_cast<int>(slot);
  cfg.json = args.Bool("json");
  // The defaults in --help name files in the work directory.
  cfg.dir = args.Has("dir") ? args.Get("dir") : "";
  cfg.source = args.Has("source") ? args.Get("source") : "";
  cfg.store = args.Has("store") ? args.Get("store") : "";
  cfg.provider = args.Get("provider");
  cfg.broken = args.Has("broken") ? args.Get("broken") : "";
  if (!cfg.broken.empty() && cfg.broken != "no-guard" && cfg.broken != "ack-before-commit")
    return Fail(cmd, Status::InvalidArgument("--broken must be no-guard or ack-before-commit, got '" + cfg.broken + "'"));
  cfg.provider_mode = args.Get("provider-mode");
  cfg.provider_store = args.Has("provider-store") ? args.Get("provider-store") : "";
  if (cfg.provider_mode != "two-phase" && cfg.provider_mode != "group-commit")
    return Fail(cmd, Status::InvalidArgument("--provider-mode must be two-phase or group-commit, got '" +
                                             cfg.provider_mode + "'"));
  if (cfg.slot >= 0) return Worker(cfg);

  if (cfg.dir.empty()) {
    std::error_code ec;
    std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
    if (ec) tmp = "/tmp";
    std::string tmpl = (tmp / "idem-chaos-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) return Fail(cmd, Status::Unavailable("cannot create a temporary directory"));
    cfg.dir = tmpl;
  } else {
    struct stat st {};
    if (::stat(cfg.dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))
      return Fail(cmd, Status::InvalidArgument("--dir " + cfg.dir + " is not a directory"));
  }
  if (cfg.source.empty()) cfg.source = "embedded:" + cfg.dir + "/queue.db?queue=payments";
  if (cfg.store.empty()) cfg.store = "sqlite:" + cfg.dir + "/payments.db";
  if (cfg.source.starts_with("embedded:")) {
    if (Status st = ResetEmbeddedQueue(cfg.source); !st.ok()) return Fail(cmd, st);
  }
  if (!cfg.json)
    std::cout << "idem chaos: seed " << cfg.seed << ", " << cfg.messages << " messages, " << cfg.consumers
              << " consumers, " << cfg.kills << " kills; files in " << cfg.dir << "\n"
              << std::flush;
  Run run(cfg, /*have_vfs=*/true);
  if (Status st = run.Prepare(); !st.ok()) return Fail(cmd, st);
  if (Status st = run.Go(); !st.ok()) return Fail(cmd, st);
  return run.Report();
}

}  // namespace idem::cli
