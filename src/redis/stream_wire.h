// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: how a Message is written into a Redis Stream entry (XADD), shared
// by StreamSource::Publish and StreamPublisher (doc/wire-format.md).
#ifndef IDEM_SRC_REDIS_STREAM_WIRE_H_
#define IDEM_SRC_REDIS_STREAM_WIRE_H_

#include <string>
#include <string_view>

#include "idem/message.h"
#include "idem/result.h"
#include "redis/client.h"

namespace idem::redis_internal {

// Prefix of the fields that carry Message::headers.
inline constexpr std::string_view kStreamHeaderPrefix = "header:";

// XADD <stream> * <id_field> <id> [idem-producer-time-ms <t>] <payload_field>
// <payload> [header:<name> <value>]...; the entry id. kInvalidArgument for
// an invalid message id.
Result<std::string> StreamAppend(Conn& conn, std::string_view stream, std::string_view id_field,
                                 std::string_view payload_field, const Message& m);

// OK, or kInvalidArgument when `field` cannot hold the id or the payload
// (empty, a producer time name, "header:...").
Status CheckStreamField(std::string_view what, std::string_view field);

}  // namespace idem::redis_internal

#endif  // IDEM_SRC_REDIS_STREAM_WIRE_H_
