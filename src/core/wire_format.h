// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: the names every source and publisher use on the wire for the
// producer time (doc/wire-format.md). Publishers write kProducerTimeHeader;
// sources read it, and the two former names, so that messages written
// before the names were unified keep their producer time.
#ifndef IDEM_SRC_CORE_WIRE_FORMAT_H_
#define IDEM_SRC_CORE_WIRE_FORMAT_H_

#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>
#include <system_error>

#include "idem/publisher.h"

namespace idem::wire_internal {

// The former names: Kafka's header and Redis Streams' field.
inline constexpr std::string_view kFormerKafkaProducerTime = "idem-produced-at-ms";
inline constexpr std::string_view kFormerRedisProducerTime = "producer_time_ms";

// 0 for the current name, 1 or 2 for a former one (a lower rank wins when a
// message carries several), -1 for any other name.
inline int ProducerTimeRank(std::string_view name) {
  if (name == kProducerTimeHeader) return 0;
  if (name == kFormerKafkaProducerTime) return 1;
  if (name == kFormerRedisProducerTime) return 2;
  return -1;
}

// A producer time as written on the wire: optional '-', decimal digits,
// nothing else.
inline std::optional<int64_t> ParseProducerTime(std::string_view text) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || p != text.data() + text.size()) return std::nullopt;
  return v;
}

// Collects the producer time from the names a message carries, by rank.
class ProducerTimeReader {
 public:
  // True when `name` is one of the producer time's names (its value is then
  // taken, or dropped when a better-ranked name was seen or it does not
  // parse): the caller does not deliver it as a header.
  bool Offer(std::string_view name, std::string_view value) {
    const int rank = ProducerTimeRank(name);
    if (rank < 0) return false;
    if (rank < rank_) {
      if (auto t = ParseProducerTime(value)) {
        time_ = *t;
        rank_ = rank;
      }
    }
    return true;
  }
  // As Offer, for a value the broker carries as an integer.
  bool OfferInt(std::string_view name, int64_t value) {
    const int rank = ProducerTimeRank(name);
    if (rank < 0) return false;
    if (rank < rank_) {
      time_ = value;
      rank_ = rank;
    }
    return true;
  }
  std::optional<int64_t> time() const { return time_; }

 private:
  int rank_ = 3;
  std::optional<int64_t> time_;
};

}  // namespace idem::wire_internal

#endif  // IDEM_SRC_CORE_WIRE_FORMAT_H_
