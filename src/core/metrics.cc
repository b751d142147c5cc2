// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/metrics.h"

#include "core/json_string.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>

namespace idem {

namespace {

constexpr size_t kKinds = kEventKinds;

// What a kind's series is labelled by.
enum class Family { kConsumer, kRelay, kScope };
constexpr std::string_view kFamilyLabel[] = {"consumer", "relay", "scope"};

struct KindInfo {
  std::string_view name;    // EventKindName
  std::string_view metric;  // the counter's name
  std::string_view help;
  Family family;  // the label: consumer=, relay= or scope=
};

constexpr std::array<KindInfo, kKinds> kInfo{{
    {"applied", "idem_applied_total", "Messages whose effect was committed.", Family::kConsumer},
    {"duplicate", "idem_duplicates_total", "Deliveries skipped because the marker existed.", Family::kConsumer},
    {"conflict", "idem_conflicts_total", "Deliveries whose id was reused for another payload.", Family::kConsumer},
    {"failed", "idem_failures_total", "Deliveries not committed (handler or store errors).", Family::kConsumer},
    {"in_progress", "idem_in_progress_total", "Deliveries given back because a step was in progress (not failures).",
     Family::kConsumer},
    {"rejected", "idem_rejected_total", "Messages the handler rejected for good (dead-lettered at once).",
     Family::kConsumer},
    {"received", "idem_received_total", "Deliveries received from the source.", Family::kConsumer},
    {"acked", "idem_acked_total", "Deliveries acknowledged after their commit.", Family::kConsumer},
    {"ack_failed", "idem_ack_errors_total", "Acknowledgements that failed after a commit.", Family::kConsumer},
    {"nacked", "idem_nacked_total", "Deliveries given back for a retry.", Family::kConsumer},
    {"dead_lettered", "idem_dead_lettered_total", "Messages moved to the dead-letter table.", Family::kConsumer},
    {"parked", "idem_parked_total", "Messages parked: in progress past the park horizon, listed by idem inspect.",
     Family::kConsumer},
    {"lease_extended", "idem_leases_extended_total", "Leases renewed while a handler ran.", Family::kConsumer},
    {"lease_lost", "idem_lease_extension_errors_total", "Lease renewals that failed (lost to another consumer).",
     Family::kConsumer},
    {"lease_overrun", "idem_lease_overruns_total",
     "Deliveries settled after their lease ran out unrenewed: a rise in duplicates follows.", Family::kConsumer},
    {"outbox_added", "idem_outbox_added_total", "Messages added to the outbox (in transactions of the caller).",
     Family::kRelay},
    {"outbox_published", "idem_outbox_published_total", "Outbox messages the broker confirmed.", Family::kRelay},
    {"outbox_republished", "idem_outbox_republished_total",
     "Outbox messages published again after a relay stopped between confirm and record.", Family::kRelay},
    {"outbox_dead_lettered", "idem_outbox_dead_lettered_total", "Outbox messages refused for good or out of attempts.",
     Family::kRelay},
    {"outbox_transient_error", "idem_outbox_transient_errors_total",
     "Outbox publishes that failed and will be retried.", Family::kRelay},
    {"in_doubt_committed", "idem_in_doubt_committed_total",
     "Commits whose outcome was unknown, found committed when the marker was read back.", Family::kConsumer},
    {"in_doubt_not_committed", "idem_in_doubt_not_committed_total",
     "Commits whose outcome was unknown, found not committed (or unreadable): delivered again.", Family::kConsumer},
    {"claim_started", "idem_claims_started_total", "Claims that made the caller the key's holder.", Family::kScope},
    {"claim_taken_over", "idem_claims_taken_over_total",
     "Claims that took a key over after its holder's lease ran out.", Family::kScope},
    {"claim_replayed", "idem_claims_replayed_total", "Claims answered with the stored result (no second execution).",
     Family::kScope},
    {"claim_in_progress", "idem_claims_in_progress_total",
     "Claims answered in progress (another holder's lease is live).", Family::kScope},
    {"claim_conflict", "idem_claims_conflicts_total", "Claims of a key with another fingerprint.", Family::kScope},
    {"claim_completed", "idem_claims_completed_total", "Results (or stored errors) recorded by a key's holder.",
     Family::kScope},
    {"claim_released", "idem_claims_released_total", "Keys given up without a result.", Family::kScope},
    {"claim_fenced", "idem_claims_fenced_total", "Writes refused because the holder's lease had been taken over.",
     Family::kScope},
    {"aborted", "idem_aborted_total",
     "Deliveries given back unfinished because the consumer was stopping (not failures).", Family::kConsumer},
}};

const KindInfo& Info(EventKind k) { return kInfo[static_cast<size_t>(k)]; }

std::atomic<uint64_t> next_generation{1};

// A label value in the text format: backslash, double quote and newline escaped.
std::string LabelValue(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Number(double v) {
  if (std::isnan(v)) return "NaN";  // the text format's spelling (printf's is "nan")
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

std::string_view EventKindName(EventKind kind) {
  const auto i = static_cast<size_t>(kind);
  return i < kKinds ? kInfo[i].name : std::string_view("unknown");
}

// One thread's counts for one series: written by that thread only (a
// relaxed load and store, no read-modify-write), read by Render and Count.
struct Metrics::Shard {
  struct Histogram {
    std::array<std::atomic<uint64_t>, 15> buckets{};  // Buckets().size() + 1 (+Inf)
    std::atomic<uint64_t> sum_us{0};
    void Observe(int64_t us) {
      // The bounds of Buckets(), in microseconds.
      static constexpr int64_t kBoundsUs[] = {100,    250,    500,     1'000,   2'500,   5'000,     10'000,
                                              25'000, 50'000, 100'000, 250'000, 500'000, 1'000'000, 5'000'000};
      size_t i = 0;
      while (i < std::size(kBoundsUs) && us > kBoundsUs[i]) ++i;
      Bump(buckets[i], 1);
      Bump(sum_us, static_cast<uint64_t>(us));
    }
  };
  static void Bump(std::atomic<uint64_t>& cell, uint64_t by) {
    cell.store(cell.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
  }
  std::array<std::atomic<uint64_t>, kKinds> counts{};
  Histogram handler, commit;
};

// A series (one consumer's, relay's or scope's name): its threads' shards.
struct Metrics::Series {
  std::map<std::thread::id, std::unique_ptr<Shard>> shards;  // guarded by Metrics::mu_
  uint64_t Count(size_t kind) const {
    uint64_t n = 0;
    for (const auto& [id, shard] : shards) n += shard->counts[kind].load(std::memory_order_relaxed);
    return n;
  }
  // The handler (h == 0) or commit histogram, added up: buckets, count, sum.
  void Histogram(int h, std::array<uint64_t, 15>& buckets, uint64_t& count, uint64_t& sum_us) const {
    buckets.fill(0);
    count = sum_us = 0;
    for (const auto& [id, shard] : shards) {
      const Shard::Histogram& hist = h == 0 ? shard->handler : shard->commit;
      for (size_t i = 0; i < buckets.size(); ++i) {
        const uint64_t b = hist.buckets[i].load(std::memory_order_relaxed);
        buckets[i] += b;
        count += b;
      }
      sum_us += hist.sum_us.load(std::memory_order_relaxed);
    }
  }
};

const std::vector<double>& Metrics::Buckets() {
  static const std::vector<double> b = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                        0.025,  0.05,    0.1,    0.25,  0.5,    1,     5};
  return b;
}

Metrics::Metrics() : generation_(next_generation.fetch_add(1)) {}
Metrics::~Metrics() = default;

Metrics::Shard* Metrics::ShardFor(std::string_view name) noexcept {
  // The last shard this thread used, checked by content: the common case
  // (one consumer per worker thread) takes no lock.
  struct Last {
    uint64_t generation = 0;
    std::string name;
    Shard* shard = nullptr;
  };
  thread_local Last last;
  if (last.generation == generation_ && last.name == name) return last.shard;
  try {
    std::lock_guard<std::mutex> l(mu_);
    auto it = series_.find(name);
    if (it == series_.end()) it = series_.emplace(std::string(name), std::make_unique<Series>()).first;
    std::unique_ptr<Shard>& shard = it->second->shards[std::this_thread::get_id()];
    if (shard == nullptr) shard = std::make_unique<Shard>();
    last.generation = generation_;
    last.name.assign(name);
    last.shard = shard.get();
    return last.shard;
  } catch (...) {
    return nullptr;  // out of memory: the event is not counted
  }
}

void Metrics::OnEvent(const Event& event) noexcept {
  Shard* s = ShardFor(event.consumer);
  if (s == nullptr) return;
  Shard::Bump(s->counts[static_cast<size_t>(event.kind)], 1);
  if (event.kind == EventKind::kApplied) {
    if (event.handler_us >= 0) s->handler.Observe(event.handler_us);
    if (event.commit_us >= 0) s->commit.Observe(event.commit_us);
  }
}

uint64_t Metrics::Count(EventKind kind, std::string_view name) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = series_.find(name);
  return it == series_.end() ? 0 : it->second->Count(static_cast<size_t>(kind));
}

void Metrics::AddGauge(std::string name, std::string help, std::string labels, std::function<double()> read) {
  std::lock_guard<std::mutex> l(mu_);
  gauges_.push_back({std::move(name), std::move(help), std::move(labels), std::move(read)});
}

std::string Metrics::Label(std::string_view name, std::string_view value) {
  return std::string(name) + "=\"" + LabelValue(value) + "\"";
}

std::string Metrics::Render() const {
  std::string out;
  std::lock_guard<std::mutex> l(mu_);
  auto labels_of = [](Family family, const std::string& name) {
    return name.empty() ? std::string() : Label(kFamilyLabel[static_cast<size_t>(family)], name);
  };
  // Each series' counts, added up over its shards once.
  std::map<std::string_view, std::array<uint64_t, kKinds>> counts;
  for (const auto& [name, s] : series_)
    for (size_t k = 0; k < kKinds; ++k) counts[name][k] = s->Count(k);
  for (size_t k = 0; k < kKinds; ++k) {
    const KindInfo& info = kInfo[k];
    bool header = false;
    for (const auto& [name, c] : counts) {
      const uint64_t v = c[k];
      // A consumer's series shows every consumer counter (zeros too); a
      // relay's only the outbox ones; a counter nobody touched is left out.
      bool any_of_family = false;
      for (size_t j = 0; j < kKinds && !any_of_family; ++j) any_of_family = kInfo[j].family == info.family && c[j] > 0;
      if (!any_of_family) continue;
      if (!header) {
        out.append("# HELP ").append(info.metric).append(" ").append(info.help).append("\n");
        out.append("# TYPE ").append(info.metric).append(" counter\n");
        header = true;
      }
      const std::string labels = labels_of(info.family, std::string(name));
      out.append(info.metric);
      if (!labels.empty()) out.append("{").append(labels).append("}");
      out.append(" ").append(std::to_string(v)).append("\n");
    }
  }
  const std::pair<const char*, const char*> hists[] = {
      {"idem_handler_seconds", "How long handlers of applied messages ran."},
      {"idem_commit_seconds", "How long the commits of applied messages took (a batch shares one)."}};
  for (int h = 0; h < 2; ++h) {
    bool header = false;
    for (const auto& [name, s] : series_) {
      std::array<uint64_t, 15> buckets;
      uint64_t count = 0, sum_us = 0;
      s->Histogram(h, buckets, count, sum_us);
      if (count == 0) continue;
      if (!header) {
        out.append("# HELP ").append(hists[h].first).append(" ").append(hists[h].second).append("\n");
        out.append("# TYPE ").append(hists[h].first).append(" histogram\n");
        header = true;
      }
      const std::string labels = labels_of(Family::kConsumer, name);
      const std::string sep = labels.empty() ? "" : ",";
      uint64_t cumulative = 0;
      const auto& b = Buckets();
      for (size_t i = 0; i <= b.size(); ++i) {
        cumulative += buckets[i];
        out.append(hists[h].first).append("_bucket{").append(labels).append(sep).append("le=\"");
        out.append(i < b.size() ? Number(b[i]) : "+Inf").append("\"} ").append(std::to_string(cumulative)).append("\n");
      }
      const std::string braces = labels.empty() ? "" : "{" + labels + "}";
      out.append(hists[h].first).append("_sum").append(braces).append(" ");
      out.append(Number(static_cast<double>(sum_us) / 1e6)).append("\n");
      out.append(hists[h].first).append("_count").append(braces).append(" ").append(std::to_string(count));
      out.append("\n");
    }
  }
  std::string last_name;
  for (const Gauge& g : gauges_) {
    if (g.name != last_name) {
      out.append("# HELP ").append(g.name).append(" ").append(g.help).append("\n");
      out.append("# TYPE ").append(g.name).append(" gauge\n");
      last_name = g.name;
    }
    out.append(g.name);
    if (!g.labels.empty()) out.append("{").append(g.labels).append("}");
    out.append(" ").append(Number(g.read ? g.read() : 0)).append("\n");
  }
  return out;
}

JsonLog::JsonLog(std::function<void(std::string_view line)> write_line) : write_line_(std::move(write_line)) {}

std::string JsonLog::Line(const Event& e) {
  std::string out = "{\"at_ms\":" + std::to_string(e.at_ms) + ",\"event\":";
  out += internal::JsonString(EventKindName(e.kind));
  auto field = [&](const char* key, std::string_view v) {
    if (v.empty()) return;
    out.append(",\"").append(key).append("\":");
    out += internal::JsonString(v);
  };
  field(kFamilyLabel[static_cast<size_t>(Info(e.kind).family)].data(), e.consumer);
  field("id", e.message_id);
  if (e.attempt > 0) out.append(",\"attempt\":").append(std::to_string(e.attempt));
  if (e.handler_us >= 0) out.append(",\"handler_us\":").append(std::to_string(e.handler_us));
  if (e.commit_us >= 0) out.append(",\"commit_us\":").append(std::to_string(e.commit_us));
  field("detail", e.detail);
  field("traceparent", e.traceparent);
  out += '}';
  return out;
}

void JsonLog::OnEvent(const Event& event) noexcept {
  try {
    const std::string line = Line(event);
    std::lock_guard<std::mutex> l(mu_);
    if (write_line_) write_line_(line);
  } catch (...) {
    // An observer never throws into the run: a line that could not be
    // built or written is lost.
  }
}

}  // namespace idem
