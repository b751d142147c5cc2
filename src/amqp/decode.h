// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: a RabbitMQ delivery's properties and body as a Message, the way
// amqp::Source reads them (doc/wire-format.md). Pure: the fuzz target
// fuzz/amqp_headers_fuzz.cc feeds it properties decoded from any bytes.
#ifndef IDEM_SRC_AMQP_DECODE_H_
#define IDEM_SRC_AMQP_DECODE_H_

#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "amqp/conn.h"
#include "core/wire_format.h"
#include "idem/message.h"

namespace idem::amqp_internal {

// The id comes from the message-id property, else from the header
// `id_header` (when not empty), else it stays empty (which ValidateId
// rejects: the Consumer dead-letters the message). The producer time's
// names and x-delivery-count are read, not delivered as headers; the
// attempt is x-delivery-count + 1, else 2 for a redelivery, else 1.
inline Message DecodeMessage(const amqp_basic_properties_t& p, amqp_bytes_t body, bool redelivered,
                             std::string_view id_header) {
  Message m;
  m.payload = Str(body);
  std::optional<int64_t> delivery_count;
  std::optional<std::string> header_id;
  wire_internal::ProducerTimeReader time;
  if (p._flags & AMQP_BASIC_HEADERS_FLAG) {
    for (int i = 0; i < p.headers.num_entries; ++i) {
      const amqp_table_entry_t& e = p.headers.entries[i];
      std::string key = Str(e.key);
      std::optional<std::string> v = FieldString(e.value);
      if (!v) continue;
      if (!id_header.empty() && key == id_header && !header_id) header_id = *v;
      // The headers that Message carries as fields are not repeated among
      // its headers.
      if (e.value.kind == AMQP_FIELD_KIND_I64 ? time.OfferInt(key, e.value.value.i64) : time.Offer(key, *v)) continue;
      if (key == "x-delivery-count") {
        delivery_count = ParseInt(*v);
        continue;
      }
      m.headers.emplace_back(std::move(key), std::move(*v));
    }
  }
  m.producer_time_ms = time.time();
  if (p._flags & AMQP_BASIC_MESSAGE_ID_FLAG) {
    m.id = Str(p.message_id);
  } else if (header_id) {
    m.id = *header_id;
  }
  if (delivery_count && *delivery_count >= 0 && *delivery_count < std::numeric_limits<int>::max()) {
    m.attempt = static_cast<int>(*delivery_count) + 1;
  } else {
    m.attempt = redelivered ? 2 : 1;  // a hint, never instead of the marker check
  }
  return m;
}

}  // namespace idem::amqp_internal

#endif  // IDEM_SRC_AMQP_DECODE_H_
