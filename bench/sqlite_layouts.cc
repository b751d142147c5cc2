// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Exploration for issue #4, in C++ (bench/sqlite_layouts.py did the first
// round in Python, whose per-row overhead blurred the ratios): SQLite marker
// layouts for random ids at N retained markers, each measured as `idem bench
// marker --batch 100` measures the store: bare business inserts vs the same
// with a marker insert per message, in alternating rounds, synchronous=NORMAL,
// checkpoints on a thread of their own (as the store does with NORMAL).
//
//   idem_sqlite_layouts LAYOUT PATH N [PAGE_SIZE [SECONDS_PER_ROUND [random|ordered]]]
//     LAYOUT  pk          the store's layout: (consumer, id) primary key, WITHOUT ROWID
//             hash16      a rowid table of markers, unique index on a 16-byte hash of (consumer, id)
//             hash8       the same with an 8-byte integer hash (the index's entries are smallest)
//             lsm_floor   a log plus sorted runs and an in-memory Bloom filter: the lower bound of
//                         a log-structured layout's write path (see the class Bloom below)
//             rowid_key   a rowid table keyed by a 64-bit integer: for time-ordered ids one that
//                         grows with them (as a UUIDv7's first 64 bits do), else an 8-byte hash;
//                         appends at the right edge take SQLite's cheap split of rowid tables
//     PATH    the file; written with N random markers on first use, reused after
//   prints one JSON line: bare and guarded messages/s, the ratio, the file's size.
//
// Only the write path is measured: what the index costs per marker. A hash
// layout would also need the collision check (compare the full id on a hash
// hit) and a migration; see doc/performance.md.
#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "idem/message.h"

namespace {

void Check(int rc, sqlite3* db, const char* what) {
  if (rc != SQLITE_OK && rc != SQLITE_DONE && rc != SQLITE_ROW) {
    std::fprintf(stderr, "%s: %s\n", what, db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
    std::exit(2);
  }
}

void Exec(sqlite3* db, const std::string& sql) {
  Check(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), db, sql.c_str());
}

std::string RandomId(std::mt19937_64& rng) {
  static const char* hex = "0123456789abcdef";
  std::string s(36, '-');
  for (size_t i = 0; i < s.size(); ++i)
    if (i != 8 && i != 13 && i != 18 && i != 23) s[i] = hex[rng() & 15];
  return s;
}

// SHA-256 as the store computes it (idem::FingerprintOf), as bytes.
std::string Sha256(const std::string& in) {
  const idem::Fingerprint f = idem::FingerprintOf(in);
  return std::string(reinterpret_cast<const char*>(f.data()), f.size());
}

struct Layout {
  std::string name;
  std::vector<std::string> ddl, index_after_load;
  std::string insert;  // ($1 consumer, $2 id, $3 fingerprint, $4 at, $5 hash)
};

Layout LayoutFor(const std::string& name) {
  if (name == "pk")
    return {name,
            {"CREATE TABLE m(consumer TEXT NOT NULL, id BLOB NOT NULL, fingerprint BLOB NOT NULL, at INTEGER NOT NULL,"
             " PRIMARY KEY (consumer, id)) WITHOUT ROWID"},
            {},
            "INSERT INTO m(consumer, id, fingerprint, at) VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING"};
  if (name == "hash16")
    return {name,
            {"CREATE TABLE m(h BLOB NOT NULL, consumer TEXT NOT NULL, id BLOB NOT NULL, fingerprint BLOB NOT NULL,"
             " at INTEGER NOT NULL)"},
            {"CREATE UNIQUE INDEX m_h ON m(h)"},
            "INSERT INTO m(h, consumer, id, fingerprint, at) VALUES (?5, ?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING"};
  if (name == "hash8")
    return {name,
            {"CREATE TABLE m(h INTEGER NOT NULL, consumer TEXT NOT NULL, id BLOB NOT NULL, fingerprint BLOB NOT NULL,"
             " at INTEGER NOT NULL)"},
            {"CREATE UNIQUE INDEX m_h ON m(h)"},
            "INSERT INTO m(h, consumer, id, fingerprint, at) VALUES (?5, ?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING"};
  if (name == "lsm_floor")
    return {name,
            {"CREATE TABLE m(seq INTEGER PRIMARY KEY, h INTEGER NOT NULL, consumer TEXT NOT NULL, id BLOB NOT NULL,"
             " fingerprint BLOB NOT NULL, at INTEGER NOT NULL)"},
            {},
            "INSERT INTO m(h, consumer, id, fingerprint, at) VALUES (?5, ?1, ?2, ?3, ?4)"};
  if (name == "rowid_key")
    return {
        name,
        {"CREATE TABLE m(k INTEGER PRIMARY KEY, consumer TEXT NOT NULL, id BLOB NOT NULL, fingerprint BLOB NOT NULL,"
         " at INTEGER NOT NULL)"},
        {},
        "INSERT INTO m(k, consumer, id, fingerprint, at) VALUES (?5, ?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING"};
  std::fprintf(stderr, "unknown layout %s (pk, hash16, hash8, lsm_floor, rowid_key)\n", name.c_str());
  std::exit(2);
}

// rowid_key's key: the measured time-ordered ids ("ffffffff-" and a counter,
// see main) map above every random one, in their order; random ids to a hash.
int64_t RowidKey(const std::string& id) {
  if (id.rfind("ffffffff-", 0) == 0) return (int64_t{1} << 62) + std::atoll(id.substr(9, 18).c_str());
  const std::string h = Sha256("bench-random" + std::string(1, '\0') + id);
  int64_t v = 0;
  std::memcpy(&v, h.data(), sizeof v);
  return v & ((int64_t{1} << 62) - 1);
}

void BindMarker(sqlite3_stmt* st, const Layout& l, const std::string& id, int64_t at) {
  static const std::string consumer = "bench-random";
  const std::string h = Sha256(consumer + '\0' + id);
  const std::string fp = Sha256(id);
  sqlite3_bind_text(st, 1, consumer.data(), static_cast<int>(consumer.size()), SQLITE_STATIC);
  sqlite3_bind_blob(st, 2, id.data(), static_cast<int>(id.size()), SQLITE_TRANSIENT);
  sqlite3_bind_blob(st, 3, fp.data(), static_cast<int>(fp.size()), SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 4, at);
  if (l.name == "hash16") {
    sqlite3_bind_blob(st, 5, h.data(), 16, SQLITE_TRANSIENT);
  } else if (l.name == "rowid_key") {
    sqlite3_bind_int64(st, 5, RowidKey(id));
  } else if (l.name == "hash8" || l.name == "lsm_floor") {
    int64_t v = 0;
    std::memcpy(&v, h.data(), sizeof v);
    sqlite3_bind_int64(st, 5, v);
  }
}

sqlite3* Open(const std::string& path, int page_size) {
  sqlite3* db = nullptr;
  Check(sqlite3_open(path.c_str(), &db), db, "open");
  Exec(db, "PRAGMA page_size=" + std::to_string(page_size) + "; PRAGMA journal_mode=WAL; PRAGMA cache_size=-16384");
  return db;
}

// The store's background checkpoints: commits past 10,000 WAL pages wake a
// thread that runs PASSIVE checkpoints; at 8x that the commit checkpoints itself.
class Checkpointer {
 public:
  Checkpointer(const std::string& path, int page_size) : db_(Open(path, page_size)) {
    thread_ = std::thread([this] {
      std::unique_lock<std::mutex> l(mu_);
      for (;;) {
        cv_.wait(l, [&] { return woken_ || stop_; });
        if (stop_) return;
        woken_ = false;
        l.unlock();
        sqlite3_wal_checkpoint_v2(db_, "main", SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
        l.lock();
      }
    });
  }
  ~Checkpointer() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
    sqlite3_close(db_);
  }
  static int Hook(void* self, sqlite3* db, const char* name, int pages) {
    auto* c = static_cast<Checkpointer*>(self);
    if (pages >= 80'000) {
      sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
    } else if (pages >= 10'000) {
      {
        std::lock_guard<std::mutex> l(c->mu_);
        c->woken_ = true;
      }
      c->cv_.notify_one();
    }
    return SQLITE_OK;
  }

 private:
  sqlite3* db_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool woken_ = false, stop_ = false;
  std::thread thread_;
};

// lsm_floor: the write path of a log-structured layout without its reads:
// markers appended to a log (rowid order), duplicates ruled out by an
// in-memory Bloom filter over every retained hash (10 bits a key, 7 probes;
// a real layout would confirm a "maybe" on disk), and every 262,144 appends
// sorted into an immutable run table (the run's build counted in the
// guarded time). No merges of runs: a lower bound on what such a layout costs.
class Bloom {
 public:
  explicit Bloom(int64_t keys) : bits_(static_cast<size_t>(std::max<int64_t>(keys, 1) * 10 / 64 + 1)) {}
  bool MaybeAdd(uint64_t h) {  // true if it may have been there
    bool all = true;
    uint64_t a = h, b = (h >> 32) | (h << 32);
    for (int i = 0; i < 7; ++i) {
      const uint64_t bit = (a + static_cast<uint64_t>(i) * b) % (bits_.size() * 64);
      uint64_t& w = bits_[bit / 64];
      const uint64_t m = uint64_t{1} << (bit % 64);
      all = all && (w & m) != 0;
      w |= m;
    }
    return all;
  }

 private:
  std::vector<uint64_t> bits_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(
        stderr,
        "usage: %s pk|hash16|hash8|lsm_floor|rowid_key PATH N [PAGE_SIZE [SECONDS_PER_ROUND [random|ordered]]]\n",
        argv[0]);
    return 2;
  }
  const Layout layout = LayoutFor(argv[1]);
  const std::string path = argv[2];
  const int64_t n = std::atoll(argv[3]);
  const int page_size = argc > 4 ? std::atoi(argv[4]) : 4096;
  const double seconds = argc > 5 ? std::atof(argv[5]) : 2.0;  // per round
  // "ordered": the measured ids are time-ordered (after every retained one), as UUIDv7 would be.
  const bool ordered = argc > 6 && std::string(argv[6]) == "ordered";
  int64_t next_ordered = 0;
  std::mt19937_64 rng(std::random_device{}());  // a rerun on the same file must not repeat its ids
  int64_t at = 1'700'000'000'000;
  const bool fresh = !std::filesystem::exists(path);
  sqlite3* db = Open(path, page_size);
  if (fresh) {  // N random markers, written sorted by key (packed pages), as `idem bench marker` does
    Exec(db, "PRAGMA synchronous=OFF");
    for (const auto& s : layout.ddl) Exec(db, s);
    Exec(db, "CREATE TABLE bench_payments(message_id TEXT NOT NULL, cents INTEGER NOT NULL)");
    std::vector<std::string> ids(static_cast<size_t>(n));
    for (auto& id : ids) id = RandomId(rng);
    if (layout.name == "pk") std::sort(ids.begin(), ids.end());
    if (layout.name == "rowid_key") {
      std::vector<std::pair<int64_t, std::string>> keyed;
      keyed.reserve(ids.size());
      for (auto& id : ids) keyed.emplace_back(RowidKey(id), std::move(id));
      std::sort(keyed.begin(), keyed.end());
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = std::move(keyed[i].second);
    }
    sqlite3_stmt* ins = nullptr;
    Check(sqlite3_prepare_v2(db, layout.insert.c_str(), -1, &ins, nullptr), db, "prepare");
    Exec(db, "BEGIN");
    for (const auto& id : ids) {
      BindMarker(ins, layout, id, ++at);
      Check(sqlite3_step(ins), db, "load");
      sqlite3_reset(ins);
    }
    Exec(db, "COMMIT");
    sqlite3_finalize(ins);
    for (const auto& s : layout.index_after_load) Exec(db, s);
    Exec(db, "PRAGMA wal_checkpoint(TRUNCATE)");
  }
  if (layout.name == "rowid_key") {  // an earlier run's ordered ids came first: count on from them
    sqlite3_stmt* mx = nullptr;
    Check(sqlite3_prepare_v2(db, "SELECT max(k) FROM m", -1, &mx, nullptr), db, "prepare");
    if (sqlite3_step(mx) == SQLITE_ROW)
      next_ordered = std::max<int64_t>(0, sqlite3_column_int64(mx, 0) - (int64_t{1} << 62));
    sqlite3_finalize(mx);
  }
  const bool lsm = layout.name == "lsm_floor";
  Bloom bloom(lsm ? n + 8'000'000 : 1);  // sized for the retained and the ones a run adds
  int64_t runs = 0, since_run = 0, maybes = 0;
  if (lsm) {  // the filter over the retained markers, as a process would load it
    sqlite3_stmt* all = nullptr;
    Check(sqlite3_prepare_v2(db, "SELECT h FROM m", -1, &all, nullptr), db, "prepare");
    while (sqlite3_step(all) == SQLITE_ROW) bloom.MaybeAdd(static_cast<uint64_t>(sqlite3_column_int64(all, 0)));
    sqlite3_finalize(all);
    Exec(db, "CREATE TABLE IF NOT EXISTS runs(n INTEGER PRIMARY KEY, last_seq INTEGER NOT NULL)");
  }
  Exec(db, "PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=0");
  Checkpointer checkpointer(path, page_size);
  sqlite3_wal_hook(db, &Checkpointer::Hook, &checkpointer);
  sqlite3_stmt *marker = nullptr, *pay = nullptr;
  Check(sqlite3_prepare_v2(db, layout.insert.c_str(), -1, &marker, nullptr), db, "prepare");
  Check(sqlite3_prepare_v2(db, "INSERT INTO bench_payments(message_id, cents) VALUES (?1, ?2)", -1, &pay, nullptr), db,
        "prepare");
  auto round = [&](bool guarded, double seconds) {
    int64_t done = 0;
    const auto t0 = std::chrono::steady_clock::now();
    double elapsed = 0;
    while (elapsed < seconds) {
      Exec(db, "BEGIN IMMEDIATE");
      for (int i = 0; i < 100; ++i) {
        std::string id = RandomId(rng);
        if (ordered) {  // "ffffffff-" sorts after every random id; then a counter
          char head[32];
          std::snprintf(head, sizeof head, "ffffffff-%018lld", static_cast<long long>(++next_ordered));
          id = std::string(head) + id.substr(27);
        }
        if (guarded && lsm) {
          const std::string h = Sha256("bench-random" + std::string(1, '\0') + id);
          uint64_t v = 0;
          std::memcpy(&v, h.data(), sizeof v);
          if (bloom.MaybeAdd(v)) ++maybes;  // a real layout would look it up in the runs
          ++since_run;
        }
        if (guarded) {
          BindMarker(marker, layout, id, ++at);
          Check(sqlite3_step(marker), db, "marker");
          sqlite3_reset(marker);
          if (sqlite3_changes(db) != 1) {
            std::fprintf(stderr, "a fresh id collided\n");
            std::exit(3);
          }
        }
        sqlite3_bind_text(pay, 1, id.data(), static_cast<int>(id.size()), SQLITE_TRANSIENT);
        sqlite3_bind_int64(pay, 2, 4000);
        Check(sqlite3_step(pay), db, "payment");
        sqlite3_reset(pay);
      }
      Exec(db, "COMMIT");
      if (lsm && since_run >= 262'144) {  // seal the log's tail into a sorted run
        const std::string run = "run_" + std::to_string(++runs) + "_" + std::to_string(rng() % 1'000'000'000);
        Exec(db, "BEGIN IMMEDIATE");
        Exec(db, "CREATE TABLE " + run + "(h INTEGER PRIMARY KEY, seq INTEGER NOT NULL)");
        Exec(db, "INSERT INTO " + run +
                     " SELECT h, seq FROM m WHERE seq > coalesce((SELECT max(last_seq) FROM runs), 0)"
                     " ORDER BY h ON CONFLICT DO NOTHING");
        Exec(db, "INSERT INTO runs(last_seq) SELECT max(seq) FROM m");
        Exec(db, "COMMIT");
        since_run = 0;
      }
      done += 100;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    return done / elapsed;
  };
  round(false, seconds / 4);
  round(true, seconds / 4);
  double bare = 0, guarded = 0;
  const int rounds = 3;
  for (int r = 0; r < rounds; ++r) {
    bare += round(false, seconds) / rounds;
    guarded += round(true, seconds) / rounds;
  }
  Exec(db, "DELETE FROM bench_payments");
  sqlite3_finalize(marker);
  sqlite3_finalize(pay);
  sqlite3_close(db);
  std::printf(
      "{\"layout\":\"%s\",\"page_size\":%d,\"retained\":%lld,\"bare_per_s\":%.0f,\"guarded_per_s\":%.0f,"
      "\"ratio\":%.2f,\"file_mib\":%.0f,\"runs_built\":%lld,\"bloom_maybes\":%lld,\"ids\":\"%s\"}\n",
      layout.name.c_str(), page_size, static_cast<long long>(n), bare, guarded, bare / guarded,
      static_cast<double>(std::filesystem::file_size(path)) / (1 << 20), static_cast<long long>(runs),
      static_cast<long long>(maybes), ordered ? "ordered" : "random");
  return 0;
}
