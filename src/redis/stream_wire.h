// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: how a Message is written into a Redis Stream entry (XADD), shared
// by StreamSource::Publish and StreamPublisher, and read back by
// StreamSource::Receive (doc/wire-format.md). The decoders take any reply:
// fuzz/redis_fields_fuzz.cc feeds them replies parsed from any bytes.
#ifndef IDEM_SRC_REDIS_STREAM_WIRE_H_
#define IDEM_SRC_REDIS_STREAM_WIRE_H_

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/message.h"
#include "idem/redis/stream_source.h"
#include "idem/result.h"
#include "idem/source.h"
#include "redis/client.h"

namespace idem::redis_internal {

// Prefix of the fields that carry Message::headers.
inline constexpr std::string_view kStreamHeaderPrefix = "header:";

// The header a message read without an id carries, saying why.
inline constexpr std::string_view kStreamErrorHeader = "idem-error";

// The argv of XADD <stream> * <id_field> <id> [idem-producer-time-ms <t>]
// <payload_field> <payload> [header:<name> <value>]...
// [header:idem-ordering-key <key>]: views into its arguments (which must
// outlive it) and its own strings.
class StreamEntry {
 public:
  StreamEntry(std::string_view stream, std::string_view id_field, std::string_view payload_field, const Message& m,
              std::string_view key);
  StreamEntry(StreamEntry&&) = default;
  std::span<const std::string_view> argv() const { return argv_; }

 private:
  std::vector<std::string> names_;  // the producer time, "header:<name>"s
  std::vector<std::string_view> argv_;
};

// Runs the XADD of StreamEntry (no key); the entry id. kInvalidArgument for
// an invalid message id.
Result<std::string> StreamAppend(Conn& conn, std::string_view stream, std::string_view id_field,
                                 std::string_view payload_field, const Message& m);

// StreamSource::ParseUrl; with need_stream false, a URL without ?stream=
// is read too (a publisher given its destinations per message).
Result<redis::StreamSource::Options> ParseStreamUrl(std::string_view url, bool need_stream);

// OK, or kInvalidArgument when `field` cannot hold the id or the payload
// (empty, a producer time name, "header:...").
Status CheckStreamField(std::string_view what, std::string_view field);

// What the decoders need to know of the source reading the entries.
struct StreamEntryFields {
  std::string_view stream, consumer;  // for the receipt and the error header
  std::string_view id_field, payload_field;
  std::string_view where;  // the source, for errors
};

// The message of one entry's field list (name, value, ...): the first
// `id_field` is the id, the first `payload_field` the payload, a producer
// time name with a valid time the producer time, "header:NAME" (and any
// other field) a header. No id: the id is empty (ValidateId refuses it) and
// the kStreamErrorHeader header says so.
Message DecodeEntry(const std::string& entry_id, const redisReply* fields, const StreamEntryFields& f);

// The deliveries of the receive script's reply ({entries, last id}, each
// entry {id, delivery count, fields}); `last` gets the last id read.
// kInternal for a reply of another shape.
Result<std::vector<Delivery>> DecodeReceiveReply(const redisReply* rep, const StreamEntryFields& f, std::string* last);

}  // namespace idem::redis_internal

#endif  // IDEM_SRC_REDIS_STREAM_WIRE_H_
