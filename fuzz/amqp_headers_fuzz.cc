// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// A RabbitMQ delivery as amqp::Source reads it: the content header's basic
// properties (message id, headers table) decoded from any bytes by
// rabbitmq-c's own decoder (amqp_decode_properties, as off the wire), then
// amqp_internal::DecodeMessage. The first byte picks the redelivered flag
// and the id header. Properties: the attempt is >= 1; the producer time's
// names and x-delivery-count are never delivered as headers.
#include <amqp.h>
#include <amqp_framing.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "amqp/decode.h"
#include "core/wire_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool redelivered = (data[0] & 1) != 0;
  const std::string_view id_header = (data[0] & 2) != 0 ? "message-id" : "";
  amqp_pool_t pool;
  init_amqp_pool(&pool, 4096);
  void* decoded = nullptr;
  amqp_bytes_t encoded{size - 1, const_cast<uint8_t*>(data + 1)};
  if (amqp_decode_properties(AMQP_BASIC_CLASS, &pool, encoded, &decoded) == AMQP_STATUS_OK && decoded != nullptr) {
    const auto& props = *static_cast<const amqp_basic_properties_t*>(decoded);
    const idem::Message m = idem::amqp_internal::DecodeMessage(props, encoded, redelivered, id_header);
    if (m.attempt < 1) __builtin_trap();
    for (const auto& [name, value] : m.headers)
      if (idem::wire_internal::ProducerTimeRank(name) >= 0 || name == "x-delivery-count") __builtin_trap();
  }
  empty_amqp_pool(&pool);
  return 0;
}
