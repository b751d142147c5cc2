// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: how the embedded queue (queue.cc) stores a message in a row of
// idem_queue_messages and reads it back. The headers column holds (u32
// length in the machine's byte order, bytes) pairs, name then value. The
// decoders read rows another process wrote (or a damaged file), so they
// take any values: fuzz/embedded_rows_fuzz.cc.
#ifndef IDEM_SRC_EMBEDDED_ROWS_H_
#define IDEM_SRC_EMBEDDED_ROWS_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/saturating.h"
#include "idem/result.h"
#include "idem/source.h"
#include "idem/transaction.h"

namespace idem::embedded_internal {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

inline std::string EncodeHeaders(const HeaderList& headers) {
  std::string out;
  auto put = [&](const std::string& s) {
    uint32_t n = static_cast<uint32_t>(s.size());
    out.append(reinterpret_cast<const char*>(&n), 4);
    out += s;
  };
  for (const auto& [k, v] : headers) {
    put(k);
    put(v);
  }
  return out;
}

// kCorruption when `in` is not a whole number of pairs.
inline Result<HeaderList> DecodeHeaders(std::string_view in) {
  HeaderList out;
  auto get = [&](std::string& s) {
    uint32_t n = 0;
    if (in.size() < 4) return false;
    std::memcpy(&n, in.data(), 4);
    in.remove_prefix(4);
    if (in.size() < n) return false;
    s.assign(in.substr(0, n));
    in.remove_prefix(n);
    return true;
  };
  while (!in.empty()) {
    std::string k, v;
    if (!get(k) || !get(v)) return Status::Corruption("queue message headers are truncated");
    out.emplace_back(std::move(k), std::move(v));
  }
  return out;
}

// The columns Receive selects, in order.
inline constexpr const char* kReceiveColumns = "seq, id, producer_time_ms, payload, headers, deliveries";

// The number of a row's next delivery, from its `deliveries` column
// (saturating: a damaged file may hold any number there).
inline int64_t NextDelivery(const std::vector<Value>& row) { return internal::SaturatingAdd(row[5].AsInt(), 1); }

// The delivery of a row of kReceiveColumns whose lease token is `token`
// (which starts with NextDelivery(row)). kInvalidArgument for a row without
// those columns, kCorruption for headers that do not decode.
inline Result<Delivery> DecodeRow(const std::vector<Value>& row, std::string_view token) {
  if (row.size() != 6) return Status::InvalidArgument("a queue row has 6 columns, not " + std::to_string(row.size()));
  Delivery d;
  d.message.id = row[1].AsText();
  if (!row[2].is_null()) d.message.producer_time_ms = row[2].AsInt();
  d.message.payload = row[3].AsText();
  IDEM_ASSIGN_OR_RETURN(d.message.headers, DecodeHeaders(row[4].AsText()));
  // Held within 1..INT_MAX: a count out of int's range must not wrap to a
  // negative attempt (which no max_attempts would ever reach).
  d.message.attempt = static_cast<int>(std::clamp<int64_t>(NextDelivery(row), 1, std::numeric_limits<int>::max()));
  d.receipt = std::to_string(row[0].AsInt()) + ":" + std::string(token);
  return d;
}

}  // namespace idem::embedded_internal

#endif  // IDEM_SRC_EMBEDDED_ROWS_H_
