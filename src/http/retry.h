// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: the bounded retry loop of a service client over
// src/http/pool.h (src/pubsub/rest.cc; src/aws/client.cc has the same
// shape): attempts with idem's backoff (src/core/backoff.h), stopped by
// StopRequested() (idem/consumer.h), and what the caller learns when no
// answer came: kUnavailable (nothing reached the server) or kInDoubt (an
// attempt may have been applied).
#ifndef IDEM_SRC_HTTP_RETRY_H_
#define IDEM_SRC_HTTP_RETRY_H_

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "core/backoff.h"
#include "idem/consumer.h"
#include "idem/env.h"
#include "idem/result.h"

namespace idem::http_internal {

// What one attempt came to.
template <typename Reply>
struct Attempt {
  std::optional<Reply> reply;  // the service answered (maybe with an error)
  bool retry = false;          // the answer is one a retry can mend (throttling, 5xx)
  bool sent = false;           // the request may have been applied (no answer after sending, or a 5xx)
  bool permanent = false;      // no answer, and another attempt cannot mend that (TLS trust)
  std::string failure;         // what went wrong, for the final message
};

struct RetryPolicy {
  int max_attempts = 5;  // tries, the first included
  int64_t backoff_base_ms = 50;
  int64_t backoff_max_ms = 2'000;
  Env* env = nullptr;  // sleeps and jitter (required)
};

// Sleeps `ms` in slices, false as soon as StopRequested().
inline bool SleepUnlessStopped(Env& env, int64_t ms) {
  while (ms > 0) {
    if (StopRequested()) return false;
    const int64_t slice = std::min<int64_t>(ms, 50);
    env.SleepMs(slice);
    ms -= slice;
  }
  return !StopRequested();
}

// Runs once(attempt number) until an answer that is not to be retried, or
// the last attempt's answer; `what` names the call in errors.
template <typename Reply, typename Once>
Result<Reply> WithRetries(const std::string& what, const RetryPolicy& p, Once once) {
  bool sent = false;
  std::string last = "no attempt made";
  for (int attempt = 1; attempt <= p.max_attempts; ++attempt) {
    if (StopRequested())
      return Status::Aborted(what + ": stopped (the Consumer is stopping)" +
                             (sent ? std::string("; an attempt may have been applied") : std::string()));
    Attempt<Reply> a = once(attempt);
    sent = sent || a.sent;
    if (a.reply && (!a.retry || attempt == p.max_attempts)) return std::move(*a.reply);
    last = a.failure;
    if (!a.reply && a.permanent) break;
    if (attempt < p.max_attempts &&
        !SleepUnlessStopped(*p.env, internal::JitteredBackoffMs(p.backoff_base_ms, p.backoff_max_ms, attempt, *p.env)))
      return Status::Aborted(what + ": stopped (the Consumer is stopping); last: " + last);
  }
  if (sent)
    return Status::InDoubt(what + ": no answer after " + std::to_string(p.max_attempts) +
                           " attempts and an attempt may have been applied; last: " + last);
  return Status::Unavailable(what + ": the service was not reached; last: " + last);
}

}  // namespace idem::http_internal

#endif  // IDEM_SRC_HTTP_RETRY_H_
