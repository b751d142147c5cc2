// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/retention.h"

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace idem {
namespace {

// "2023-11-14T22:13:20.000Z": a refusal names times a reader can place.
std::string UtcTime(int64_t ms) {
  const int64_t s = ms >= 0 ? ms / 1000 : -((-ms + 999) / 1000);
  const time_t t = static_cast<time_t>(s);
  struct tm tm {};
  if (gmtime_r(&t, &tm) == nullptr) return std::to_string(ms) + " ms";
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms - s * 1000));
  return buf;
}

// "2d 3h 4m 5s" (seconds rounded up: "1s" for a few ms).
std::string Span(int64_t ms) {
  int64_t s = ms / 1000 + (ms % 1000 != 0 ? 1 : 0);
  std::string out;
  for (const auto& [unit, len] : {std::pair{"d", int64_t{86'400}}, {"h", int64_t{3'600}}, {"m", int64_t{60}}}) {
    if (s < len) continue;
    out += std::to_string(s / len) + unit + " ";
    s %= len;
  }
  if (s > 0 || out.empty()) out += std::to_string(s) + "s ";
  out.pop_back();
  return out;
}

}  // namespace

Result<NamedHorizon> HorizonOf(Source& source, std::string name) {
  if (name.empty()) name = "the " + std::string(source.Kind()) + " source";
  auto h = source.Horizon();
  if (!h.ok()) return h.status().WithContext("redelivery horizon of " + name);
  return NamedHorizon{*h, std::move(name)};
}

NamedHorizon DeclaredHorizon(int64_t at_ms, std::string from) {
  return {RedeliveryHorizon::At(at_ms), std::move(from)};
}

NamedHorizon EarlierHorizon(const NamedHorizon& a, const NamedHorizon& b) {
  using Kind = RedeliveryHorizon::Kind;
  if (!b.horizon.known()) return a;
  if (!a.horizon.known()) return b;
  if (b.horizon.kind == Kind::kNone) return a;
  if (a.horizon.kind == Kind::kNone) return b;
  return b.horizon.at_ms < a.horizon.at_ms ? b : a;
}

Status CheckPurgeBefore(int64_t before_ms, const NamedHorizon& horizon) {
  switch (horizon.horizon.kind) {
    case RedeliveryHorizon::Kind::kNone: return Status::OK();
    case RedeliveryHorizon::Kind::kUnknown:
      return Status::InvalidArgument(
          "purge refused: " + horizon.from +
          " cannot tell its redelivery horizon (the oldest message it may still deliver), so nothing says which "
          "markers are safe to delete; declare a horizon, or force the purge");
    case RedeliveryHorizon::Kind::kAt: break;
  }
  const int64_t at = horizon.horizon.at_ms;
  if (before_ms <= at) return Status::OK();
  return Status::InvalidArgument(
      "purge refused: the cut (markers processed before " + UtcTime(before_ms) + ") lies " + Span(before_ms - at) +
      " after the redelivery horizon " + UtcTime(at) + " of " + horizon.from +
      ": a marker processed since then may guard a message that can still be delivered, and would apply again; "
      "cut at or before the horizon, or force the purge");
}

Result<int64_t> PurgeMarkers(Store& store, const PurgeRequest& request, const NamedHorizon& horizon) {
  if (request.batch_size < 1)
    return Status::InvalidArgument("purge: batch_size must be at least 1, got " + std::to_string(request.batch_size));
  if (!request.force) IDEM_RETURN_IF_ERROR(CheckPurgeBefore(request.before_ms, horizon));
  return store.Purge(request.consumer, request.before_ms, request.batch_size);
}

void AddHorizonGauge(Metrics& metrics, Source& source, std::string_view consumer, Env* env, int64_t refresh_ms) {
  // The last answer and when it came: the broker is asked at most once per
  // refresh_ms, however often the endpoint is scraped.
  struct Sampled {
    std::mutex mu;
    bool asked = false;
    int64_t asked_at_ms = 0;
    std::optional<RedeliveryHorizon> horizon;  // empty: the last ask failed
  };
  auto sampled = std::make_shared<Sampled>();
  if (env == nullptr) env = Env::Default();
  metrics.AddGauge("idem_redelivery_horizon_seconds",
                   "Age of the oldest message the source may still deliver (0: none; NaN: the source cannot tell). "
                   "A marker retention shorter than this is refused by idem purge.",
                   Metrics::Label("consumer", consumer), [sampled, &source, env, refresh_ms]() -> double {
                     std::lock_guard<std::mutex> l(sampled->mu);
                     const int64_t now = env->NowMs();
                     if (!sampled->asked || now - sampled->asked_at_ms >= refresh_ms) {
                       auto h = source.Horizon();
                       sampled->horizon = h.ok() ? std::optional<RedeliveryHorizon>(*h) : std::nullopt;
                       sampled->asked = true;
                       sampled->asked_at_ms = now;
                     }
                     if (!sampled->horizon || !sampled->horizon->known())
                       return std::numeric_limits<double>::quiet_NaN();
                     if (sampled->horizon->kind == RedeliveryHorizon::Kind::kNone) return 0;
                     return static_cast<double>(std::max<int64_t>(0, now - sampled->horizon->at_ms)) / 1000.0;
                   });
}

}  // namespace idem
