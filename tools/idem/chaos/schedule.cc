// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "chaos/schedule.h"

#include <algorithm>

#include "idem/sqlite/store.h"

namespace idem::cli::chaos {

Schedule::Schedule(const Config& cfg, bool postgres, bool have_vfs)
    : cfg_(cfg), postgres_(postgres), faults_(postgres || have_vfs) {
  points_ = {"inbox.before_marker", "inbox.after_marker", "inbox.after_work", "commit",
             "inbox.after_commit",  "consumer.after_ack", "inbox.batch_mid"};
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

Plan Schedule::Next(int slot) {
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

int64_t Schedule::NextProviderLeaseMs() {
  const int64_t lo = ProviderLeaseMinMs(), hi = ProviderLeaseMaxMs();
  return lo + static_cast<int64_t>(provider_rng_() % static_cast<uint64_t>(hi - lo + 1));
}

std::string Schedule::NextProviderPoint() {
  const bool group = cfg_.provider_mode == "group-commit";
  const char* point = provider_rng_() % 2 == 0 ? (group ? "http.group_before_commit" : "http.after_claim")
                                               : (group ? "http.group_after_commit" : "http.before_complete");
  return std::string(point) + ":" + std::to_string(20 + provider_rng_() % 200);
}

}  // namespace idem::cli::chaos
