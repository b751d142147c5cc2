// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "amqp/conn.h"

#include <charconv>
#include <system_error>

namespace idem::amqp_internal {

timeval ToTimeval(int64_t ms) {
  ms = std::max<int64_t>(0, ms);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  return tv;
}

amqp_bytes_t Bytes(std::string_view s) {
  amqp_bytes_t b;
  b.len = s.size();
  b.bytes = const_cast<char*>(s.data());
  return b;
}

std::string Str(amqp_bytes_t b) {
  return b.len == 0 ? std::string() : std::string(static_cast<const char*>(b.bytes), b.len);
}

// A rabbitmq-c reply as words, and the AMQP reply code of a server exception.
std::string ReplyText(const amqp_rpc_reply_t& r) {
  switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL: return "ok";
    case AMQP_RESPONSE_NONE: return "no reply";
    case AMQP_RESPONSE_LIBRARY_EXCEPTION: return amqp_error_string2(r.library_error);
    case AMQP_RESPONSE_SERVER_EXCEPTION:
      if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD && r.reply.decoded != nullptr) {
        auto* m = static_cast<amqp_connection_close_t*>(r.reply.decoded);
        return "the broker closed the connection: " + std::to_string(m->reply_code) + " " + Str(m->reply_text);
      }
      if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD && r.reply.decoded != nullptr) {
        auto* m = static_cast<amqp_channel_close_t*>(r.reply.decoded);
        return "the broker closed the channel: " + std::to_string(m->reply_code) + " " + Str(m->reply_text);
      }
      return "unexpected server method " + std::to_string(r.reply.id);
  }
  return "unknown reply";
}

int ReplyCode(const amqp_rpc_reply_t& r) {
  if (r.reply_type != AMQP_RESPONSE_SERVER_EXCEPTION || r.reply.decoded == nullptr) return 0;
  if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD)
    return static_cast<amqp_connection_close_t*>(r.reply.decoded)->reply_code;
  if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) return static_cast<amqp_channel_close_t*>(r.reply.decoded)->reply_code;
  return 0;
}

// 403 ACCESS_REFUSED, 404 NOT_FOUND, 406 PRECONDITION_FAILED, ...
Status Translate(const amqp_rpc_reply_t& r, const std::string& what) {
  const std::string m = "amqp: " + what + ": " + ReplyText(r);
  switch (ReplyCode(r)) {
    case AMQP_NOT_FOUND: return Status::NotFound(m);
    case AMQP_PRECONDITION_FAILED: return Status::InvalidArgument(m);
    default: return Status::Unavailable(m);
  }
}

// Renders a header value as a string; nullopt for kinds with no plain text.
std::optional<std::string> FieldString(const amqp_field_value_t& v) {
  switch (v.kind) {
    case AMQP_FIELD_KIND_UTF8:
    case AMQP_FIELD_KIND_BYTES: return Str(v.value.bytes);
    case AMQP_FIELD_KIND_BOOLEAN: return std::string(v.value.boolean ? "true" : "false");
    case AMQP_FIELD_KIND_I8: return std::to_string(v.value.i8);
    case AMQP_FIELD_KIND_U8: return std::to_string(v.value.u8);
    case AMQP_FIELD_KIND_I16: return std::to_string(v.value.i16);
    case AMQP_FIELD_KIND_U16: return std::to_string(v.value.u16);
    case AMQP_FIELD_KIND_I32: return std::to_string(v.value.i32);
    case AMQP_FIELD_KIND_U32: return std::to_string(v.value.u32);
    case AMQP_FIELD_KIND_I64: return std::to_string(v.value.i64);
    case AMQP_FIELD_KIND_U64:
    case AMQP_FIELD_KIND_TIMESTAMP: return std::to_string(v.value.u64);
    case AMQP_FIELD_KIND_F32: return std::to_string(v.value.f32);
    case AMQP_FIELD_KIND_F64: return std::to_string(v.value.f64);
    default: return std::nullopt;
  }
}

std::optional<int64_t> ParseInt(std::string_view s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace idem::amqp_internal
