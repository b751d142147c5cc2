// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Retention bound to the redelivery horizon. A marker must outlive every copy
// of its message that can still come: purged by age alone, the markers of
// messages a source still holds (a consumer down for hours, acks lost, a
// rebalance that redelivers) go first, and those messages apply again when
// they come. A purge here is refused while its cut lies after the horizon:
// the time of the oldest message the source may still deliver
// (Source::Horizon), or a horizon the user declares where the source cannot
// tell (RabbitMQ) or a replay may reach further back.
//
//   auto horizon = idem::HorizonOf(queue);                       // the source's
//   if (!horizon.ok()) return horizon.status();
//   auto purged = idem::PurgeMarkers(store, {.consumer = "payments",
//                                            .before_ms = now_ms - 7 * 86'400'000}, *horizon);
//   // kInvalidArgument, nothing deleted, when the queue still holds a message
//   // older than the cut; the message names the horizon, its time and source.
//
// Thread safety: the functions may be called from any thread; a gauge added
// by AddHorizonGauge is read by Metrics::Render, from any thread.
#ifndef IDEM_RETENTION_H_
#define IDEM_RETENTION_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "idem/env.h"
#include "idem/metrics.h"
#include "idem/result.h"
#include "idem/source.h"
#include "idem/status.h"
#include "idem/store.h"

namespace idem {

// A horizon and what it comes from, named in a refusal.
struct NamedHorizon {
  RedeliveryHorizon horizon{};
  // "the embedded source", "embedded:queue.db?queue=payments", "declared
  // (--horizon 3d)": whatever tells the reader where the time came from.
  std::string from{};
};

// Asks `source` for its horizon (Source::Horizon), named `name` (default:
// "the <Kind()> source"). The source's errors, with that name as context.
Result<NamedHorizon> HorizonOf(Source& source, std::string name = {});

// A horizon the user declares: no message older than `at_ms` (ms since the
// Unix epoch) can still be delivered or replayed.
NamedHorizon DeclaredHorizon(int64_t at_ms, std::string from);

// Of two horizons, the one that keeps more markers: a known one over
// Unknown, the older of two times, a time over None. Both Unknown: the
// first.
NamedHorizon EarlierHorizon(const NamedHorizon& a, const NamedHorizon& b);

// OK when a purge of the markers processed before `before_ms` keeps every
// marker processed at or after the horizon's time, or the horizon is None.
// kInvalidArgument otherwise, naming the cut, the horizon's time and where
// it comes from; and when the horizon is Unknown (nothing says what is
// safe: declare one).
Status CheckPurgeBefore(int64_t before_ms, const NamedHorizon& horizon);

struct PurgeRequest {
  // Whose markers: empty for every consumer (the horizon then bounds them
  // all).
  std::string consumer{};
  // Markers processed before this (ms since the Unix epoch) are deleted.
  int64_t before_ms = 0;
  // Markers deleted per transaction (>= 1). Default: 10000.
  int batch_size = 10'000;
  // Purge even when CheckPurgeBefore refuses: markers of messages the source
  // may still deliver go, and those messages apply again. Default: false.
  bool force = false;
};

// Store::Purge behind CheckPurgeBefore: how many markers were deleted, or
// its refusal (kInvalidArgument, nothing deleted). kInvalidArgument too for
// a batch_size below 1.
Result<int64_t> PurgeMarkers(Store& store, const PurgeRequest& request, const NamedHorizon& horizon);

// Adds the gauge idem_redelivery_horizon_seconds{consumer="<consumer>"} to
// `metrics`: at each Render, the age of `source`'s horizon (now minus its
// time, in seconds, on `env`'s clock; 0 when nothing is left to deliver; NaN
// when the source cannot tell or could not be asked). The source is asked at
// most once per `refresh_ms` (a query to the broker), and the last answer
// ages in between. A retention shorter than this age is one that purge
// refuses. `source` and `env` must outlive every Render. `env` default
// (nullptr): Env::Default().
void AddHorizonGauge(Metrics& metrics, Source& source, std::string_view consumer, Env* env = nullptr,
                     int64_t refresh_ms = 10'000);

}  // namespace idem

#endif  // IDEM_RETENTION_H_
