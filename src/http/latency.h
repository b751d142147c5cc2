// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Request-latency histograms by outcome, and the Prometheus text they and
// the counters beside them are written in: one piece for every HTTP server
// of idem's that serves /metrics (the Idempotency-Key middleware's
// Idempotency::Metrics, which `idem provider` serves, and the gateway's).
//
//   static constexpr std::string_view kOutcomes[] = {"executed", "replayed"};
//   http_internal::LatencyByOutcome latency(kOutcomes);
//   latency.Add(0, seconds);                      // on any thread
//   latency.Write(out, "idem_http_request_seconds", "Time from a request to its answer, by outcome.");
//
// Thread safety: Add may run on every thread at once; Write reads relaxed
// counts (a scrape during requests may see one request in some series and
// not yet in others).
#ifndef IDEM_SRC_HTTP_LATENCY_H_
#define IDEM_SRC_HTTP_LATENCY_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace idem::http_internal {

// "# HELP name help\n# TYPE name type\nname value\n".
inline void AppendMetric(std::string& out, std::string_view name, std::string_view help, std::string_view type,
                         uint64_t value) {
  out.append("# HELP ").append(name).append(" ").append(help).append("\n");
  out.append("# TYPE ").append(name).append(" ").append(type).append("\n");
  out.append(name).append(" ").append(std::to_string(value)).append("\n");
}

class LatencyByOutcome {
 public:
  // Upper bounds of the buckets, in seconds (+Inf besides).
  static constexpr std::array<double, 14> kBuckets = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05,
                                                      0.1,    0.25,  0.5,   1,     2.5,  5,     10};

  // `outcomes`: the label values, in the order Add's index names them; the
  // strings must outlive this (string literals).
  explicit LatencyByOutcome(std::span<const std::string_view> outcomes)
      : outcomes_(outcomes), series_(std::make_unique<Series[]>(outcomes.size())) {}

  size_t size() const { return outcomes_.size(); }

  // One request of outcome `outcome` (an index into the outcomes) that took
  // `seconds`. An index out of range is not counted.
  void Add(size_t outcome, double seconds) {
    if (outcome >= outcomes_.size()) return;
    Series& s = series_[outcome];
    for (size_t i = 0; i < kBuckets.size(); ++i)
      if (seconds <= kBuckets[i]) s.buckets[i].fetch_add(1, std::memory_order_relaxed);
    s.count.fetch_add(1, std::memory_order_relaxed);
    s.sum_us.fetch_add(static_cast<uint64_t>(seconds * 1e6), std::memory_order_relaxed);
  }
  // Add with the time since `start`.
  void AddSince(size_t outcome, std::chrono::steady_clock::time_point start) {
    Add(outcome, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }

  uint64_t Count(size_t outcome) const {
    return outcome < outcomes_.size() ? series_[outcome].count.load(std::memory_order_relaxed) : 0;
  }

  // The histogram `name` (HELP, TYPE, then per outcome its cumulative
  // buckets, +Inf, _sum and _count), appended to `out`.
  void Write(std::string& out, std::string_view name, std::string_view help) const {
    const std::string n(name);
    out.append("# HELP ").append(n).append(" ").append(help).append("\n");
    out.append("# TYPE ").append(n).append(" histogram\n");
    for (size_t o = 0; o < outcomes_.size(); ++o) {
      const Series& s = series_[o];
      const std::string label = "outcome=\"" + std::string(outcomes_[o]) + "\"";
      for (size_t i = 0; i < kBuckets.size(); ++i) {
        char le[32];
        std::snprintf(le, sizeof le, "%g", kBuckets[i]);
        out += n + "_bucket{" + label + ",le=\"" + le + "\"} " +
               std::to_string(s.buckets[i].load(std::memory_order_relaxed)) + "\n";
      }
      const uint64_t count = s.count.load(std::memory_order_relaxed);
      out += n + "_bucket{" + label + ",le=\"+Inf\"} " + std::to_string(count) + "\n";
      char sum[32];
      std::snprintf(sum, sizeof sum, "%.6f", static_cast<double>(s.sum_us.load(std::memory_order_relaxed)) / 1e6);
      out += n + "_sum{" + label + "} " + sum + "\n";
      out += n + "_count{" + label + "} " + std::to_string(count) + "\n";
    }
  }

 private:
  struct Series {
    std::array<std::atomic<uint64_t>, kBuckets.size()> buckets{};  // cumulative: seconds <= the bound
    std::atomic<uint64_t> count{0};
    std::atomic<uint64_t> sum_us{0};
  };
  std::span<const std::string_view> outcomes_;
  std::unique_ptr<Series[]> series_;
};

}  // namespace idem::http_internal

#endif  // IDEM_SRC_HTTP_LATENCY_H_
