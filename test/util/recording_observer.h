// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Recorder: an Observer (idem/observer.h) that keeps a copy of every event,
// for tests that check what a run told.
#ifndef IDEM_TEST_UTIL_RECORDING_OBSERVER_H_
#define IDEM_TEST_UTIL_RECORDING_OBSERVER_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "idem/observer.h"

namespace idem::testing {

// Keeps a copy of every event.
class Recorder final : public Observer {
 public:
  struct Seen {
    EventKind kind;
    std::string consumer, id, detail, traceparent;
    int64_t handler_us, commit_us;
  };
  void OnEvent(const Event& e) noexcept override {
    std::lock_guard<std::mutex> l(mu_);
    seen_.push_back({e.kind, std::string(e.consumer), std::string(e.message_id), std::string(e.detail),
                     std::string(e.traceparent), e.handler_us, e.commit_us});
  }
  std::vector<Seen> Of(EventKind kind) {
    std::lock_guard<std::mutex> l(mu_);
    std::vector<Seen> out;
    for (const Seen& s : seen_)
      if (s.kind == kind) out.push_back(s);
    return out;
  }
  size_t size() {
    std::lock_guard<std::mutex> l(mu_);
    return seen_.size();
  }

 private:
  std::mutex mu_;
  std::vector<Seen> seen_;
};

}  // namespace idem::testing

#endif  // IDEM_TEST_UTIL_RECORDING_OBSERVER_H_
