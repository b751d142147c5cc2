// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Two observers (idem/observer.h) to use as they are:
//
//  - Metrics: Prometheus counters per consumer and per relay, and histograms
//    of handler and commit time, rendered in the Prometheus text format by
//    Render() for an endpoint of yours (idem's own commands serve the same
//    text on --metrics):
//      idem_applied_total{consumer="payments"} 1042
//      idem_duplicates_total{consumer="payments"} 17
//      idem_lease_overruns_total{consumer="payments"} 0
//      idem_handler_seconds_bucket{consumer="payments",le="0.005"} 1001 ...
//      idem_outbox_published_total{relay="relay"} 998
//    doc/observability.md lists every name and what to alert on.
//  - JsonLog: one JSON object per event, one line each, to a sink of yours.
//
// Both are thread-safe. Observers gives one event to several.
#ifndef IDEM_METRICS_H_
#define IDEM_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "idem/observer.h"

namespace idem {

class Metrics final : public Observer {
 public:
  Metrics();
  ~Metrics() override;
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  void OnEvent(const Event& event) noexcept override;

  // Every counter and histogram so far, then the gauges, in the Prometheus
  // text exposition format (version 0.0.4).
  std::string Render() const;
  // A gauge read at each Render (a backlog, an age): `name` in the
  // Prometheus grammar, `labels` already formatted (`relay="r1"`) or empty.
  // `read` returns NaN for a value not known (rendered NaN).
  void AddGauge(std::string name, std::string help, std::string labels, std::function<double()> read);
  // One label for AddGauge, its value escaped: Label("consumer", "a\"b") is
  // consumer="a\"b".
  static std::string Label(std::string_view name, std::string_view value);

  // How many events of `kind` came for `name` (a consumer's or a relay's).
  uint64_t Count(EventKind kind, std::string_view name) const;

  // The upper bounds of the latency histograms, in seconds.
  static const std::vector<double>& Buckets();

 private:
  struct Series;
  struct Shard;
  // This thread's shard of the series `name` (each thread counts in its own,
  // with no atomic read-modify-write; Render and Count add them up).
  Shard* ShardFor(std::string_view name) noexcept;

  const uint64_t generation_;  // tells this registry from an earlier one at the same address
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<Series>, std::less<>> series_;  // guarded by mu_
  struct Gauge {
    std::string name{}, help{}, labels{};
    std::function<double()> read{};
  };
  std::vector<Gauge> gauges_;  // guarded by mu_
};

class JsonLog final : public Observer {
 public:
  // `write_line` gets each line without its newline; it is called from the
  // observed threads, one call at a time.
  explicit JsonLog(std::function<void(std::string_view line)> write_line);
  void OnEvent(const Event& event) noexcept override;
  // The line for `event`: {"at_ms":...,"event":"applied","consumer":"...",
  // "id":"...",...}; fields not set (-1, empty) are left out.
  static std::string Line(const Event& event);

 private:
  std::mutex mu_;
  std::function<void(std::string_view)> write_line_;
};

// Gives each event to every observer in turn.
class Observers final : public Observer {
 public:
  explicit Observers(std::vector<Observer*> observers) : observers_(std::move(observers)) {}
  void OnEvent(const Event& event) noexcept override {
    for (Observer* o : observers_)
      if (o != nullptr) o->OnEvent(event);
  }

 private:
  std::vector<Observer*> observers_;
};

}  // namespace idem

#endif  // IDEM_METRICS_H_
