// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/trace.h"

#include <utility>

namespace idem {

namespace {

thread_local const TraceContext* t_current = nullptr;

constexpr size_t kTraceparentBytes = 55;  // 2 + 1 + 32 + 1 + 16 + 1 + 2
constexpr size_t kMaxTracestateBytes = 512;

bool LowerHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

// `n` lower-case hex digits at `s`, not all zeros when `nonzero`.
bool HexField(std::string_view s, bool nonzero) {
  bool any = false;
  for (char c : s) {
    if (!LowerHex(c)) return false;
    any = any || c != '0';
  }
  return any || !nonzero;
}

bool ValidTracestate(std::string_view s) {
  if (s.size() > kMaxTracestateBytes) return false;
  for (char c : s)
    if (c < 0x20 || c > 0x7e) return false;
  return true;
}

}  // namespace

bool IsValidTraceparent(std::string_view tp) {
  if (tp.size() < kTraceparentBytes) return false;
  const std::string_view version = tp.substr(0, 2);
  if (!HexField(version, false) || version == "ff") return false;
  // Version 00 is exactly 55 characters; a later version may add fields
  // after a '-' (W3C Trace Context, "versioning of traceparent").
  if (version == "00" ? tp.size() != kTraceparentBytes : tp.size() > kTraceparentBytes && tp[55] != '-') return false;
  if (tp[2] != '-' || tp[35] != '-' || tp[52] != '-') return false;
  return HexField(tp.substr(3, 32), true) && HexField(tp.substr(36, 16), true) && HexField(tp.substr(53, 2), false);
}

TraceContext TraceContext::Of(const Message& message) {
  TraceContext c;
  auto tp = message.Header("traceparent");
  if (!tp || !IsValidTraceparent(*tp)) return c;
  c.traceparent = std::string(*tp);
  if (auto ts = message.Header("tracestate"); ts && ValidTracestate(*ts)) c.tracestate = std::string(*ts);
  return c;
}

const TraceContext* CurrentTrace() noexcept { return t_current; }

TraceScope::TraceScope(TraceContext context) : context_(std::move(context)), previous_(t_current) {
  t_current = context_.empty() ? nullptr : &context_;
}

TraceScope::~TraceScope() { t_current = previous_; }

}  // namespace idem
