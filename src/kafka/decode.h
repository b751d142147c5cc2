// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: a Kafka record's headers, key and value as a Message, the way
// kafka::Source reads them (doc/wire-format.md). Pure: the fuzz target
// fuzz/kafka_headers_fuzz.cc feeds it headers made from any bytes.
#ifndef IDEM_SRC_KAFKA_DECODE_H_
#define IDEM_SRC_KAFKA_DECODE_H_

#include <librdkafka/rdkafka.h>

#include <string>
#include <string_view>

#include "core/wire_format.h"
#include "idem/message.h"

namespace idem::kafka_internal {

// What DecodeRecord reads from a record besides its headers.
struct RecordParts {
  const void* payload = nullptr;  // the value; null for none
  size_t len = 0;
  const void* key = nullptr;  // null for none
  size_t key_len = 0;
};

// The message of a record whose headers are `hdrs` (null for none). The id is
// the first header named `id_header`, else the record key when
// `id_from_key`, else empty. Every header is delivered, the producer time's
// names too (and read as the producer time). attempt is 0: Kafka keeps no
// delivery count.
inline Message DecodeRecord(const rd_kafka_headers_t* hdrs, const RecordParts& r, std::string_view id_header,
                            bool id_from_key) {
  Message msg;
  msg.attempt = 0;
  if (r.payload != nullptr) msg.payload.assign(static_cast<const char*>(r.payload), r.len);
  bool have_id = false;
  wire_internal::ProducerTimeReader time;
  if (hdrs != nullptr) {
    const char* name = nullptr;
    const void* value = nullptr;
    size_t size = 0;
    for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; ++i) {
      std::string v = value ? std::string(static_cast<const char*>(value), size) : std::string();
      if (!have_id && id_header == name) {
        msg.id = v;
        have_id = true;
      }
      time.Offer(name, v);
      msg.headers.emplace_back(name, std::move(v));
    }
  }
  msg.producer_time_ms = time.time();
  if (!have_id && id_from_key && r.key != nullptr) msg.id.assign(static_cast<const char*>(r.key), r.key_len);
  return msg;
}

}  // namespace idem::kafka_internal

#endif  // IDEM_SRC_KAFKA_DECODE_H_
