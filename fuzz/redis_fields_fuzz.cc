// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// A Redis Stream read as redis::StreamSource reads it: any bytes parsed as
// RESP replies by hiredis's own reader (as off the socket), each given to
// the receive decoder (redis_internal::DecodeReceiveReply) and, when it is
// an array, to the entry decoder as one entry's field list. Properties: an
// entry without the id field gives an empty id and the error header saying
// so; each receipt ends with the consumer.
// hiredis 0.14's reader allocates the element array an array header
// announces before any element arrives ("*800000000" is 6.4 GB): the Redis
// server is trusted with that (doc/reliability.md, Known limits), so inputs
// announcing more than kMaxElements elements are not fed to it.
#include <hiredis.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "redis/stream_wire.h"

namespace {

constexpr idem::redis_internal::StreamEntryFields kFields{
    .stream = "s", .consumer = "c", .id_field = "id", .payload_field = "payload", .where = "fuzz"};

// Whether a field list (name, value, ...) names the id field.
bool NamesId(const redisReply* fields) {
  for (size_t k = 0; k + 1 < fields->elements; k += 2)
    if (idem::redis_internal::ReplyString(fields->element[k]) == kFields.id_field) return true;
  return false;
}

bool HasErrorHeader(const idem::Message& m) {
  for (const auto& [name, value] : m.headers)
    if (name == idem::redis_internal::kStreamErrorHeader) return true;
  return false;
}

constexpr uint64_t kMaxElements = 4096;

// Whether `in` holds an array header ('*' and digits) above kMaxElements.
bool AnnouncesHugeArray(std::string_view in) {
  for (size_t at = in.find('*'); at != std::string_view::npos; at = in.find('*', at + 1)) {
    uint64_t n = 0;
    for (size_t i = at + 1; i < in.size() && in[i] >= '0' && in[i] <= '9' && n <= kMaxElements; ++i)
      n = n * 10 + static_cast<uint64_t>(in[i] - '0');
    if (n > kMaxElements) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (AnnouncesHugeArray(std::string_view(reinterpret_cast<const char*>(data), size))) return 0;
  redisReader* reader = redisReaderCreate();
  if (reader == nullptr) return 0;
  if (redisReaderFeed(reader, reinterpret_cast<const char*>(data), size) == REDIS_OK) {
    for (int i = 0; i < 64; ++i) {
      void* got = nullptr;
      if (redisReaderGetReply(reader, &got) != REDIS_OK || got == nullptr) break;
      const auto* reply = static_cast<const redisReply*>(got);
      std::string last;
      auto deliveries = idem::redis_internal::DecodeReceiveReply(reply, kFields, &last);
      if (deliveries.ok()) {
        for (const idem::Delivery& d : *deliveries)
          if (d.receipt.size() < 3 || d.receipt.substr(d.receipt.size() - 2) != ":c") __builtin_trap();
      }
      if (reply->type == REDIS_REPLY_ARRAY) {
        const idem::Message m = idem::redis_internal::DecodeEntry("1-0", reply, kFields);
        if (!NamesId(reply) && (!m.id.empty() || !HasErrorHeader(m))) __builtin_trap();
      }
      freeReplyObject(got);
    }
  }
  redisReaderFree(reader);
  return 0;
}
