// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The outbox conformance suite (conformance/outbox_conformance_test.cc),
// written once and instantiated for every store that has an outbox, and the
// recording publisher its relays publish through.
#ifndef IDEM_TEST_UTIL_OUTBOX_CONFORMANCE_H_
#define IDEM_TEST_UTIL_OUTBOX_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "idem/outbox.h"
#include "idem/outbox_relay.h"
#include "idem/publisher.h"
#include "util/store_conformance.h"

namespace idem::testing {

// Confirms (or refuses) what the relay hands over, and remembers it: every
// copy in order, per destination and key, and whether one id was ever in
// flight twice at once.
class RecordingPublisher final : public Publisher {
 public:
  struct Copy {
    std::string destination, key, id, payload;
    std::vector<std::pair<std::string, std::string>> headers;
    std::optional<int64_t> producer_time_ms;
  };
  // The answer for a message (OK by default); called under the lock.
  std::function<Status(const Message&)> answer;
  bool ordered = false;
  int max_batch = 50;

  Status Publish(const Message& m) override {
    Outgoing o{"", "", &m};
    return PublishBatch(std::span<const Outgoing>(&o, 1))[0];
  }
  std::vector<Status> PublishBatch(std::span<const Outgoing> batch) override {
    std::vector<Status> out;
    {
      std::lock_guard lock(mu_);
      for (const Outgoing& o : batch)
        if (!in_flight_.insert(o.message->id).second) twice_at_once_ = true;
    }
    std::lock_guard lock(mu_);
    for (const Outgoing& o : batch) {
      in_flight_.erase(o.message->id);
      Status s = answer ? answer(*o.message) : Status::OK();
      if (s.ok())
        copies_.push_back(Copy{std::string(o.destination), std::string(o.key), o.message->id, o.message->payload,
                               o.message->headers, o.message->producer_time_ms});
      out.push_back(std::move(s));
    }
    return out;
  }
  PublisherTraits traits() const override { return {.ordered_batch = ordered, .max_batch = max_batch}; }
  std::string_view Kind() const override { return "recording"; }

  std::vector<Copy> copies() const {
    std::lock_guard lock(mu_);
    return copies_;
  }
  bool twice_at_once() const {
    std::lock_guard lock(mu_);
    return twice_at_once_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Copy> copies_;
  std::set<std::string> in_flight_;
  bool twice_at_once_ = false;
};

// Per key, the ids of the first copies in the order they were published.
inline std::map<std::string, std::vector<std::string>> FirstCopiesByKey(
    const std::vector<RecordingPublisher::Copy>& copies) {
  std::map<std::string, std::vector<std::string>> out;
  std::set<std::string> seen;
  for (const auto& c : copies)
    if (seen.insert(c.id).second) out[c.key].push_back(c.id);
  return out;
}

class OutboxConformance : public StoreConformance {};

}  // namespace idem::testing

#endif  // IDEM_TEST_UTIL_OUTBOX_CONFORMANCE_H_
