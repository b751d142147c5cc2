// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "chaos/schedule.h"

#include <algorithm>
#include <array>

#include "idem/sqlite/store.h"
#include "idem/url.h"

namespace idem::cli::chaos {

Schedule::Schedule(const Config& cfg, bool postgres, bool have_vfs)
    : cfg_(cfg),
      postgres_(postgres),
      dynamodb_(UrlScheme(cfg.store) == "dynamodb"),
      sqlite_(!postgres_ && !dynamodb_),
      faults_(postgres || (have_vfs && sqlite_)) {
  points_ = {"inbox.before_marker", "inbox.after_marker", "inbox.after_work", "commit",
             "inbox.after_commit",  "consumer.after_ack", "inbox.batch_mid",  "consumer.after_receive",
             "consumer.lease_lost"};
  // Kafka's offset mode runs kafka::OffsetInbox in a loop of its own: its
  // points instead of the Inbox's and the Consumer's.
  if (OffsetMode(cfg))
    points_ = {"offset_inbox.after_claim", "offset_inbox.after_work", "commit", "offset_inbox.after_commit"};
  // SQLite's COMMIT ran, its outcome not yet read (PostgreSQL's counterpart,
  // postgres.commit_sent, is the "commit" point there).
  if (sqlite_) points_.push_back("sqlite.commit_done");
  // DynamoDB: before TransactWriteItems, and after it committed but before
  // the store or the Inbox learned it (the "commit" point's place).
  if (dynamodb_) points_.push_back("dynamodb.before_commit");
  if (!faults_ && !dynamodb_) points_.erase(std::find(points_.begin(), points_.end(), "commit"));
  // A store that checkpoints on its own thread: that thread dies too.
  if (sqlite_) {
    auto o = sqlite::Store::ParseUrl(cfg.store);
    if (o.ok() && sqlite::Store::CheckpointsInBackground(*o)) points_.push_back("sqlite.checkpoint");
  }
  // Stage 1 adds to its outbox after the effect (the two-stage pipeline).
  if (TwoStage(cfg)) points_.push_back("outbox.after_add");
  // Every slot, relays too (seeded as the consumers are: a run without
  // them draws what it drew before).
  for (int s = 0; s < AllSlots(cfg); ++s) {
    rngs_.emplace_back(cfg.seed * 1'000'003ULL + static_cast<uint64_t>(s) * 7'919ULL + 1);
    next_point_[s] = static_cast<size_t>(s);  // the slots start at different points
  }
  provider_rng_.seed(cfg.seed * 1'000'003ULL + 999'983ULL);
  for (int s = 0; s < AllSlots(cfg); ++s) hold_rngs_.emplace_back(cfg.seed * 2'000'029ULL + static_cast<uint64_t>(s));
  provider_hold_rng_.seed(cfg.seed * 2'000'029ULL + 777'767ULL);
}

// A pause, starvation or clock jumps for consumer `slot`'s next life, or
// false.
bool Schedule::NextHold(int slot, Plan& p) {
  std::mt19937_64& rng = hold_rngs_[static_cast<size_t>(slot)];
  const double roll = std::uniform_real_distribution<double>(0, 1)(rng);
  const int64_t lease = cfg_.lease_ms;
  const int64_t life = lives_[slot]++;
  // Drawn at its rate; and each kind with a rate is given to every slot
  // once early on whatever the draws (at a life that differs per slot and
  // kind), so a short run, or one whose timing gave few lives, still has
  // every kind.
  const double rates[3] = {cfg_.pause_rate, cfg_.starve_rate, cfg_.clock_jump_rate};
  std::array<bool, 3>& given = holds_given_[slot];
  int kind = roll < rates[0] ? 0 : roll < rates[0] + rates[1] ? 1 : roll < rates[0] + rates[1] + rates[2] ? 2 : -1;
  for (int k = 0; k < 3; ++k)
    if (rates[k] > 0 && !given[static_cast<size_t>(k)] && life == 2 + (slot * 3 + k * 2) % 9) kind = k;
  // (Not a pause in a slot's first life: those start together, and a pause
  // needs the others running to take over what it holds.)
  if (kind < 0 || (life == 0 && kind == 0)) return false;
  given[static_cast<size_t>(kind)] = true;
  if (kind == 0) {
    // Stopped where it holds work: deliveries received, its marker in the
    // open transaction, its handler done, or its commit done and the ack not
    // yet made; the unfenced consumer between its guard's read and its
    // effect. Past the lease: the supervisor continues it once another
    // consumer has received what it holds (supervisor.h), so it finishes as
    // a zombie after a takeover.
    // (On SQLite the open transaction holds the file's write lock, which
    // stops every other consumer's commits: one such point of three there.)
    static const char* const kPoints[] = {"consumer.after_receive", "inbox.after_marker", "inbox.after_work",
                                          "inbox.after_commit"};
    static const char* const kSqlitePoints[] = {"consumer.after_receive", "inbox.after_work", "inbox.after_commit"};
    static const char* const kOffsetPoints[] = {"offset_inbox.after_claim", "offset_inbox.after_work",
                                                "offset_inbox.after_commit"};
    const size_t k = next_pause_point_[slot]++;
    const std::string point = cfg_.broken == "unfenced" ? "chaos.unfenced_after_check"
                              : OffsetMode(cfg_)        ? kOffsetPoints[k % std::size(kOffsetPoints)]
                              : !sqlite_                ? kPoints[k % std::size(kPoints)]
                                                        : kSqlitePoints[k % std::size(kSqlitePoints)];
    p.kill_point = point + ":" + std::to_string(1 + rng() % static_cast<uint64_t>(cfg_.hits)) + ":stop";
    p.pause_ms = lease + 100 + static_cast<int64_t>(rng() % 500);
    // The others take the held deliveries over only when they reach them
    // (a backlog published before comes first): wait for that, up to
    // kTakeoverWaitMs, except where the pause stops everyone (SQLite's write
    // lock held).
    const bool holds_sqlite_lock = sqlite_ && (point.starts_with("inbox.") || point.starts_with("offset_inbox."));
    p.takeover_wait_ms = holds_sqlite_lock && point != "inbox.after_commit" && point != "offset_inbox.after_commit"
                             ? 0
                             : kTakeoverWaitMs;
    p.label = "pause:" + point;
    // (Its timer waits while it is stopped: this is running time.) A Kafka
    // member takes seconds to join its group (the rebalance waits for the
    // others) before it holds a record: its life is that much longer.
    p.kill_after_ms =
        800 + 100 * cfg_.hits + static_cast<int64_t>(rng() % 1'200) + (cfg_.source.starts_with("kafka") ? 10'000 : 0);
    return true;
  }
  if (kind == 1) {
    // Stopped 30..150 ms, run 5..30 ms, for one to three leases and more:
    // its leases run out under it while it still works now and then.
    p.starve_after_ms = 50 + static_cast<int64_t>(rng() % 500);
    p.starve_for_ms = lease + 200 + static_cast<int64_t>(rng() % static_cast<uint64_t>(2 * lease + 1'000));
    p.starve_stop_ms = 30 + static_cast<int64_t>(rng() % 121);
    p.starve_run_ms = 5 + static_cast<int64_t>(rng() % 26);
    p.label = "starve";
    p.kill_after_ms = p.starve_after_ms + p.starve_for_ms + 200 + static_cast<int64_t>(rng() % 1'000);
    return true;
  }
  // Clock jumps: forward past the lease (it takes what others hold, its own leases look
  // run out), back past it (it renews too late, trusts a lease the others
  // see as expired), then right again.
  const int64_t forward = lease + 100 + static_cast<int64_t>(rng() % static_cast<uint64_t>(3 * lease));
  const int64_t back = -(lease + 100 + static_cast<int64_t>(rng() % static_cast<uint64_t>(3 * lease)));
  const int64_t t1 = 100 + static_cast<int64_t>(rng() % 400);
  const int64_t t2 = t1 + 300 + static_cast<int64_t>(rng() % 700);
  const int64_t t3 = t2 + 300 + static_cast<int64_t>(rng() % 700);
  if (rng() % 2 == 0) {
    p.clock_jumps = {{t1, forward}, {t2, back}, {t3, 0}};
  } else {
    p.clock_jumps = {{t1, back}, {t2, forward}, {t3, 0}};
  }
  p.label = "clock";
  p.kill_after_ms = t3 + 300 + static_cast<int64_t>(rng() % 1'000);
  return true;
}

// A fault for `slot`'s life: its PostgreSQL backends terminated, or an
// I/O error of the fault VFS; the life then ends by a kill too.
void Schedule::Fault(int slot, Plan& p) {
  std::mt19937_64& rng = rngs_[static_cast<size_t>(slot)];
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
}

Plan Schedule::Next(int slot) {
  std::mt19937_64& rng = rngs_[static_cast<size_t>(slot)];
  const bool batch = slot % 2 == 1 && cfg_.batch > 1;
  Plan p;
  if (NextHold(slot, p)) return p;
  const double roll = std::uniform_real_distribution<double>(0, 1)(rng);
  if (faults_ && roll < cfg_.fault_rate) {
    Fault(slot, p);
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
    } else if (dynamodb_) {
      p.kill_point = "dynamodb.commit_done:" + std::to_string(hit);
      p.label = "kill:dynamodb.commit_done";
    } else {
      p.vfs = "kill:sync:" + std::to_string(hit);
      p.label = "kill:sqlite.inside_commit";
    }
  } else {
    p.kill_point = point + ":" + std::to_string(hit);
  }
  // A life whose point is never reached (idle) still ends; a Kafka member
  // first waits for its group to rebalance, which waits out the session
  // timeout (10 s by default) of a member killed before.
  p.kill_after_ms =
      3'000 + 250 * cfg_.hits + static_cast<int64_t>(rng() % 2'000) + (cfg_.source.starts_with("kafka") ? 12'000 : 0);
  return p;
}

Plan Schedule::NextRelay(int slot) {
  std::mt19937_64& rng = rngs_[static_cast<size_t>(slot)];
  Plan p;
  const double roll = std::uniform_real_distribution<double>(0, 1)(rng);
  if (faults_ && roll < cfg_.fault_rate) {
    Fault(slot, p);
    return p;
  }
  if (roll < cfg_.fault_rate + 0.2) {
    p.kill_after_ms = 10 + static_cast<int64_t>(rng() % static_cast<uint64_t>(60 * cfg_.hits));
    p.label = "kill:timed";
    return p;
  }
  // Where a relay's crash matters, in turn: before a hand-over, after it
  // before its confirm is recorded, inside the settle, after the settle.
  static const char* const kPoints[] = {"relay.before_publish", "relay.after_publish", "relay.before_settle_commit",
                                        "relay.after_settle"};
  const std::string point = kPoints[next_point_[slot]++ % std::size(kPoints)];
  p.kill_point = point + ":" + std::to_string(1 + rng() % static_cast<uint64_t>(cfg_.hits));
  p.label = "kill:" + point;
  p.kill_after_ms = 3'000 + 250 * cfg_.hits + static_cast<int64_t>(rng() % 2'000);
  return p;
}

void Schedule::RelayPointMissed(int slot) {
  size_t& next = next_point_[slot];
  if (next > 0) --next;
}

int64_t Schedule::NextProviderLeaseMs() {
  const int64_t lo = ProviderLeaseMinMs(), hi = ProviderLeaseMaxMs();
  return lo + static_cast<int64_t>(provider_rng_() % static_cast<uint64_t>(hi - lo + 1));
}

Plan Schedule::NextProvider(int64_t lease_ms) {
  const bool group = cfg_.provider_mode == "group-commit";
  const char* point = provider_rng_() % 2 == 0 ? (group ? "http.group_before_commit" : "http.after_claim")
                                               : (group ? "http.group_after_commit" : "http.before_complete");
  Plan p;
  p.kill_point = std::string(point) + ":" + std::to_string(20 + provider_rng_() % 200);
  p.label = "kill:" + std::string(point);
  const bool pause = cfg_.pause_rate > 0 && provider_lives_++ % kProviderPauseEvery == 3;
  if (pause) {
    // Stopped holding claims (two-phase: one claimed, its charge not yet
    // made; group commit: a group run, not committed), past the lease: the
    // clients give up and retry, and when it goes on the retries may take the
    // keys over while its requests finish (fenced, or absorbed by the
    // charge's unique key).
    const char* at = group ? "http.group_before_commit" : "http.after_claim";
    p.kill_point = std::string(at) + ":" + std::to_string(1 + provider_hold_rng_() % 40) + ":stop";
    p.pause_ms = lease_ms + 200 + static_cast<int64_t>(provider_hold_rng_() % 500);
    p.label = "pause:" + std::string(at);
    p.kill_after_ms = 300 + static_cast<int64_t>(provider_hold_rng_() % 1'200);
  }
  return p;
}

}  // namespace idem::cli::chaos
