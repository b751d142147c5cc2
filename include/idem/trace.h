// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Trace context: the W3C Trace Context (traceparent, tracestate) of the
// message a handler works on, kept for the handler's thread so that what the
// handler starts continues the same trace:
//
//  - the Inbox sets it from the message's `traceparent` and `tracestate`
//    headers around the handler (and around CallFirst's calls);
//  - http::Client sends it on every request that does not carry its own;
//  - Outbox::Add writes it into the outgoing message when the message has
//    no traceparent of its own, so the next consumer continues the trace.
//
// No tracing library is needed. To make idem's hops spans of your tracer
// (OpenTelemetry, say), start a span from CurrentTrace() in the handler and
// put that span's context in a TraceScope of your own around the calls and
// Adds: they carry your span as the parent (doc/observability.md).
//
// Thread safety: the current context is per thread; a TraceScope belongs to
// the thread that made it.
#ifndef IDEM_TRACE_H_
#define IDEM_TRACE_H_

#include <string>
#include <string_view>

#include "idem/message.h"

namespace idem {

struct TraceContext {
  // "00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>" (lower case).
  // Empty: no trace.
  std::string traceparent{};
  // Vendors' entries, passed through as they came (at most 512 bytes of
  // visible ASCII and spaces, else dropped). May be empty.
  std::string tracestate{};

  bool empty() const { return traceparent.empty(); }

  // The context `message` carries in its "traceparent" and "tracestate"
  // headers; empty when it has none or its traceparent is malformed (a
  // malformed one is not passed on).
  static TraceContext Of(const Message& message);
};

// True when `traceparent` is a valid W3C traceparent: version 00 with its
// exact 55 characters, or a later version (not ff) whose first 55
// characters have version 00's shape; lower-case hex; neither the trace id
// nor the parent id all zeros.
bool IsValidTraceparent(std::string_view traceparent);

// The trace context of the work running on this thread: the message whose
// handler runs here (set by the Inbox), or a TraceScope of yours. nullptr
// when there is none.
const TraceContext* CurrentTrace() noexcept;

// While alive, `context` is the calling thread's current trace context
// (an empty one: none). Scopes nest; the previous one comes back at the end.
class TraceScope {
 public:
  explicit TraceScope(TraceContext context);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  TraceContext context_;
  const TraceContext* previous_;
};

}  // namespace idem

#endif  // IDEM_TRACE_H_
