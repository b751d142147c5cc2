// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: a Pub/Sub message as idem reads it (include/idem/pubsub/source.h
// says how), apart from the calls, so that the unit tests can feed it
// messages no publisher of ours would write.
#ifndef IDEM_SRC_PUBSUB_WIRE_H_
#define IDEM_SRC_PUBSUB_WIRE_H_

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "idem/source.h"

namespace idem::pubsub_internal {

// An attribute value that is not printable UTF-8 text (any byte string: a
// binary header, an id with control bytes) is written base64-encoded under
// the name with this prefix ("idem-b64:trace" for header "trace"), as
// attribute values are text.
inline constexpr std::string_view kBase64AttributePrefix = "idem-b64:";

// Whether `value` must go as a kBase64AttributePrefix attribute: not valid
// UTF-8, or holding a control character (below 0x20, or 0x7f).
bool NeedsBase64(std::string_view value);

struct DecodeSettings {
  std::string_view subscription;  // for messages
  std::string_view id_attribute;
  bool id_fallback = true;
};

// One element of a pull answer's receivedMessages: its ackId is the
// receipt, deliveryAttempt the attempt (0 when absent). A message without a
// valid id, or whose data is not base64, has an empty id and a header
// pubsub::kErrorHeader saying why.
Delivery DecodeReceived(const nlohmann::json& received, const DecodeSettings& settings);

}  // namespace idem::pubsub_internal

#endif  // IDEM_SRC_PUBSUB_WIRE_H_
