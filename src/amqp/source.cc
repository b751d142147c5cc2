// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::amqp on rabbitmq-c 0.11 (Debian's librabbitmq-dev). One connection
// and one channel (1) per Source or Publisher, behind a mutex.
#include "idem/amqp/source.h"

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#include <poll.h>
#include <sys/time.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace idem::amqp {
namespace {

constexpr amqp_channel_t kChannel = 1;

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

std::string Str(amqp_bytes_t b) { return b.len == 0 ? std::string() : std::string(static_cast<const char*>(b.bytes), b.len); }

// A rabbitmq-c reply as words, and the AMQP reply code of a server exception.
std::string ReplyText(const amqp_rpc_reply_t& r) {
  switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL:
      return "ok";
    case AMQP_RESPONSE_NONE:
      return "no reply";
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
      return amqp_error_string2(r.library_error);
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
  if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) return static_cast<amqp_connection_close_t*>(r.reply.decoded)->reply_code;
  if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) return static_cast<amqp_channel_close_t*>(r.reply.decoded)->reply_code;
  return 0;
}

// 403 ACCESS_REFUSED, 404 NOT_FOUND, 406 PRECONDITION_FAILED, ...
Status FromReply(const amqp_rpc_reply_t& r, const std::string& what) {
  const std::string m = "amqp: " + what + ": " + ReplyText(r);
  switch (ReplyCode(r)) {
    case AMQP_NOT_FOUND:
      return Status::NotFound(m);
    case AMQP_PRECONDITION_FAILED:
      return Status::InvalidArgument(m);
    default:
      return Status::Unavailable(m);
  }
}

// Renders a header value as a string; nullopt for kinds with no plain text.
std::optional<std::string> FieldString(const amqp_field_value_t& v) {
  switch (v.kind) {
    case AMQP_FIELD_KIND_UTF8:
    case AMQP_FIELD_KIND_BYTES:
      return Str(v.value.bytes);
    case AMQP_FIELD_KIND_BOOLEAN:
      return std::string(v.value.boolean ? "true" : "false");
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
    default:
      return std::nullopt;
  }
}

std::optional<int64_t> ParseInt(std::string_view s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// Decodes "%XX" escapes. Plain text otherwise.
Result<std::string> PercentDecode(std::string_view s, std::string_view what) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    if (i + 2 >= s.size() || hex(s[i + 1]) < 0 || hex(s[i + 2]) < 0)
      return Status::InvalidArgument("amqp url: bad %-escape in the " + std::string(what));
    out.push_back(static_cast<char>(hex(s[i + 1]) * 16 + hex(s[i + 2])));
    i += 2;
  }
  return out;
}

// A connection with its channel 1 open. Destroying it closes the socket: the
// broker then requeues every unacknowledged delivery of it.
class Conn {
 public:
  Conn() = default;
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  ~Conn() { Reset(false); }

  amqp_connection_state_t get() const { return st_; }
  explicit operator bool() const { return st_ != nullptr; }

  // Politely (connection.close, bounded by the RPC timeout) or not.
  void Reset(bool polite) {
    if (st_ == nullptr) return;
    if (polite) (void)amqp_connection_close(st_, AMQP_REPLY_SUCCESS);
    amqp_destroy_connection(st_);
    st_ = nullptr;
  }

  // Connects, logs in and opens channel 1.
  Status Open(const Endpoint& ep, int heartbeat_s, int64_t timeout_ms) {
    Reset(false);
    amqp_connection_state_t st = amqp_new_connection();
    if (st == nullptr) return Status::Internal("amqp: out of memory");
    st_ = st;
    amqp_socket_t* sock = amqp_tcp_socket_new(st);
    if (sock == nullptr) {
      Reset(false);
      return Status::Internal("amqp: cannot create a socket");
    }
    timeval tv = ToTimeval(timeout_ms);
    int rc = amqp_socket_open_noblock(sock, ep.host.c_str(), ep.port, &tv);
    if (rc != AMQP_STATUS_OK) {
      Reset(false);
      return Status::Unavailable("amqp: cannot connect to " + ep.Where() + ": " + amqp_error_string2(rc));
    }
    (void)amqp_set_handshake_timeout(st, &tv);
    (void)amqp_set_rpc_timeout(st, &tv);
    amqp_rpc_reply_t r = amqp_login(st, ep.vhost.c_str(), 0, 131072, heartbeat_s, AMQP_SASL_METHOD_PLAIN,
                                    ep.user.c_str(), ep.password.c_str());
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
      Reset(false);
      // The password is never part of the message.
      Status s = FromReply(r, "login as '" + ep.user + "' to " + ep.Where() + " vhost '" + ep.vhost + "'");
      return s.code() == Code::kUnavailable ? s : Status::Unavailable(s.message());
    }
    amqp_channel_open(st, kChannel);
    r = amqp_get_rpc_reply(st);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
      Reset(false);
      return FromReply(r, "channel.open on " + ep.Where());
    }
    return Status::OK();
  }

  // After an RPC: OK, or the error (and the connection is dropped).
  Status Check(const std::string& what) {
    amqp_rpc_reply_t r = amqp_get_rpc_reply(st_);
    if (r.reply_type == AMQP_RESPONSE_NORMAL) return Status::OK();
    Status s = FromReply(r, what);
    Reset(false);
    return s;
  }

  Status DeclareQueue(const std::string& queue, const Endpoint& ep, const std::string& type = "") {
    amqp_table_entry_t arg{};
    amqp_table_t args = amqp_empty_table;
    if (!type.empty() && type != "classic") {
      arg.key = amqp_cstring_bytes("x-queue-type");
      arg.value.kind = AMQP_FIELD_KIND_UTF8;
      arg.value.value.bytes = Bytes(type);
      args.num_entries = 1;
      args.entries = &arg;
    }
    amqp_queue_declare(st_, kChannel, Bytes(queue), /*passive=*/0, /*durable=*/1, /*exclusive=*/0,
                       /*auto_delete=*/0, args);
    return Check("declare queue '" + queue + "' on " + ep.Where());
  }

 private:
  amqp_connection_state_t st_ = nullptr;
};

class SourceImpl final : public Source {
 public:
  SourceImpl(SourceOptions o, Endpoint ep) : o_(std::move(o)), ep_(std::move(ep)) {}
  ~SourceImpl() override {
    std::lock_guard<std::mutex> l(mu_);
    conn_.Reset(true);
  }

  Status ConnectLocked() {
    outstanding_.clear();
    held_.clear();
    IDEM_RETURN_IF_ERROR(conn_.Open(ep_, o_.heartbeat_s, o_.connect_timeout_ms));
    if (o_.declare_queue) IDEM_RETURN_IF_ERROR(conn_.DeclareQueue(o_.queue, ep_, o_.queue_type));
    amqp_basic_qos(conn_.get(), kChannel, 0, static_cast<uint16_t>(o_.prefetch), 0);
    IDEM_RETURN_IF_ERROR(conn_.Check("basic.qos on " + ep_.Where()));
    consuming_ = false;
    ++generation_;
    return Status::OK();
  }

  // basic.consume, at the first Receive on a connection: a Source that is
  // open but never asked for messages must not take any (RabbitMQ pushes up
  // to the prefetch to every consumer, asked or not).
  Status StartConsumingLocked() {
    if (consuming_) return Status::OK();
    amqp_basic_consume(conn_.get(), kChannel, Bytes(o_.queue), amqp_empty_bytes, /*no_local=*/0, /*no_ack=*/0,
                       /*exclusive=*/0, amqp_empty_table);
    Status s = conn_.Check("consume queue '" + o_.queue + "' on " + ep_.Where());
    if (!s.ok()) {
      outstanding_.clear();
      held_.clear();
      return s;
    }
    consuming_ = true;
    return Status::OK();
  }

  Result<std::vector<Delivery>> Receive(int max, int64_t wait_ms) override {
    if (max < 1) return Status::InvalidArgument("amqp: Receive needs max >= 1, not " + std::to_string(max));
    Env* env = o_.env;
    const int64_t start = env->NowMs();
    const int64_t deadline = wait_ms > std::numeric_limits<int64_t>::max() - start ? std::numeric_limits<int64_t>::max()
                                                                                  : start + std::max<int64_t>(0, wait_ms);
    std::vector<Delivery> out;
    for (;;) {
      int fd = -1;
      {
        std::lock_guard<std::mutex> l(mu_);
        ExpireLeasesLocked();
        FlushDueNacksLocked();
        if (!conn_) IDEM_RETURN_IF_ERROR(ConnectLocked());
        IDEM_RETURN_IF_ERROR(StartConsumingLocked());
        while (static_cast<int>(out.size()) < max) {
          amqp_maybe_release_buffers(conn_.get());
          amqp_envelope_t envelope;
          timeval zero{0, 0};
          amqp_rpc_reply_t r = amqp_consume_message(conn_.get(), &envelope, &zero, 0);
          if (r.reply_type == AMQP_RESPONSE_NORMAL) {
            out.push_back(ToDelivery(envelope));
            outstanding_[envelope.delivery_tag] = LeaseEnd();
            amqp_destroy_envelope(&envelope);
            continue;
          }
          if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && r.library_error == AMQP_STATUS_TIMEOUT) break;
          std::string why;
          if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
            // A method other than basic.deliver: the broker closing the
            // channel or the connection, or cancelling the consumer (queue
            // deleted). Each ends this connection.
            amqp_frame_t frame;
            int rc = amqp_simple_wait_frame_noblock(conn_.get(), &frame, &zero);
            if (rc == AMQP_STATUS_OK && frame.frame_type == AMQP_FRAME_METHOD) {
              const amqp_method_t& m = frame.payload.method;
              if (m.id == AMQP_BASIC_ACK_METHOD || m.id == AMQP_BASIC_NACK_METHOD) continue;
              if (m.id == AMQP_CONNECTION_CLOSE_METHOD) {
                auto* c = static_cast<amqp_connection_close_t*>(m.decoded);
                why = "the broker closed the connection: " + std::to_string(c->reply_code) + " " + Str(c->reply_text);
                amqp_connection_close_ok_t ok{};
                (void)amqp_send_method(conn_.get(), 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
              } else if (m.id == AMQP_CHANNEL_CLOSE_METHOD) {
                auto* c = static_cast<amqp_channel_close_t*>(m.decoded);
                why = "the broker closed the channel: " + std::to_string(c->reply_code) + " " + Str(c->reply_text);
              } else if (m.id == AMQP_BASIC_CANCEL_METHOD) {
                why = "the broker cancelled the consumer (queue '" + o_.queue + "' deleted?)";
              } else {
                why = "unexpected method " + std::to_string(m.id);
              }
            } else if (rc == AMQP_STATUS_TIMEOUT) {
              continue;
            } else if (rc == AMQP_STATUS_OK) {
              continue;  // a stray content frame: nothing to do with it
            } else {
              why = amqp_error_string2(rc);
            }
          } else {
            why = ReplyText(r);
          }
          // The connection is gone; so is every delivery of it (the broker
          // requeues them), including those received in this call.
          conn_.Reset(false);
          outstanding_.clear();
          held_.clear();
          return Status::Unavailable("amqp: connection to " + ep_.Where() + " lost: " + why +
                                     " (reconnecting at the next Receive)");
        }
        if (!out.empty()) return out;
        fd = amqp_get_sockfd(conn_.get());
      }
      const int64_t now = env->NowMs();
      if (now >= deadline) return out;
      // Wait for the socket without holding the mutex, in short steps (a
      // lease may run out, a held nack fall due; another thread may read
      // what arrives).
      const int64_t step = std::min<int64_t>(deadline - now, 50);
      pollfd p{fd, POLLIN, 0};
      if (env == Env::Default()) {
        (void)::poll(&p, 1, static_cast<int>(std::max<int64_t>(1, step)));
      } else if (::poll(&p, 1, 5) == 0) {
        env->SleepMs(step);  // nothing came: move the test's clock instead
      }
    }
  }

  Status Ack(const Delivery& d) override { return Settle(d, /*ack=*/true, 0); }
  Status Nack(const Delivery& d, int64_t delay_ms) override { return Settle(d, /*ack=*/false, delay_ms); }

  // The optional client-side lease (SourceOptions::lease_ms): 0 without one.
  int64_t lease_ms() const override { return o_.lease_ms; }

  Status ExtendLease(const Delivery& d) override {
    auto parsed = ParseReceipt(d.receipt);
    if (!parsed) return Status::InvalidArgument("amqp: not a receipt of an amqp source: '" + d.receipt + "'");
    const auto [gen, tag] = *parsed;
    std::lock_guard<std::mutex> l(mu_);
    // As for an ack: a lease that ran out is given back first, and is lost.
    ExpireLeasesLocked();
    auto it = conn_ && gen == generation_ ? outstanding_.find(tag) : outstanding_.end();
    if (it == outstanding_.end()) {
      return Status::LeaseLost("amqp: lease extension of delivery " + std::to_string(tag) +
                                    ": it was acknowledged or nacked, its lease ran out, or its connection is gone");
    }
    it->second = LeaseEnd();
    return Status::OK();
  }

  Status Reconnect() override {
    std::lock_guard<std::mutex> l(mu_);
    conn_.Reset(false);
    return ConnectLocked();
  }
  uint64_t generation() const override {
    std::lock_guard<std::mutex> l(mu_);
    return generation_;
  }

 private:
  struct Held {
    int64_t due_ms;
    uint64_t tag;
  };

  Delivery ToDelivery(const amqp_envelope_t& env) const {
    Delivery d;
    Message& m = d.message;
    const amqp_basic_properties_t& p = env.message.properties;
    m.payload = Str(env.message.body);
    std::optional<int64_t> delivery_count;
    std::optional<std::string> header_id;
    if (p._flags & AMQP_BASIC_HEADERS_FLAG) {
      for (int i = 0; i < p.headers.num_entries; ++i) {
        const amqp_table_entry_t& e = p.headers.entries[i];
        std::string key = Str(e.key);
        std::optional<std::string> v = FieldString(e.value);
        if (!v) continue;
        if (!o_.id_header.empty() && key == o_.id_header && !header_id) header_id = *v;
        // The two headers that Message carries as fields are not repeated
        // among its headers.
        if (key == kProducerTimeHeader) {
          if (auto t = ParseInt(*v)) m.producer_time_ms = *t;
          continue;
        }
        if (key == "x-delivery-count") {
          delivery_count = ParseInt(*v);
          continue;
        }
        m.headers.emplace_back(std::move(key), std::move(*v));
      }
    }
    if (p._flags & AMQP_BASIC_MESSAGE_ID_FLAG) {
      m.id = Str(p.message_id);
    } else if (header_id) {
      m.id = *header_id;
    }
    // Neither: the id stays empty, which ValidateId rejects, so the Consumer
    // dead-letters the message at once.
    if (delivery_count && *delivery_count >= 0 && *delivery_count < std::numeric_limits<int>::max()) {
      m.attempt = static_cast<int>(*delivery_count) + 1;
    } else {
      m.attempt = env.redelivered ? 2 : 1;  // a hint, never instead of the marker check
    }
    d.receipt = "amqp:" + std::to_string(generation_) + ":" + std::to_string(env.delivery_tag);
    return d;
  }

  // Parses "amqp:<generation>:<tag>".
  static std::optional<std::pair<uint64_t, uint64_t>> ParseReceipt(std::string_view r) {
    if (r.substr(0, 5) != "amqp:") return std::nullopt;
    r.remove_prefix(5);
    const size_t colon = r.find(':');
    if (colon == std::string_view::npos) return std::nullopt;
    uint64_t g = 0, t = 0;
    auto a = std::from_chars(r.data(), r.data() + colon, g);
    auto b = std::from_chars(r.data() + colon + 1, r.data() + r.size(), t);
    if (a.ec != std::errc() || a.ptr != r.data() + colon || b.ec != std::errc() || b.ptr != r.data() + r.size())
      return std::nullopt;
    return std::make_pair(g, t);
  }

  Status Settle(const Delivery& d, bool ack, int64_t delay_ms) {
    auto parsed = ParseReceipt(d.receipt);
    if (!parsed) return Status::InvalidArgument("amqp: not a receipt of an amqp source: '" + d.receipt + "'");
    const auto [gen, tag] = *parsed;
    std::lock_guard<std::mutex> l(mu_);
    ExpireLeasesLocked();
    FlushDueNacksLocked();
    if (!conn_ || gen != generation_) {
      return Status::LeaseLost("amqp: delivery " + std::to_string(tag) + " came on connection " +
                                    std::to_string(gen) + ", which is gone: the broker requeued the message");
    }
    if (outstanding_.erase(tag) == 0) {
      return Status::LeaseLost("amqp: delivery " + std::to_string(tag) +
                                    " was already acknowledged or nacked, or its lease ran out");
    }
    int rc;
    if (ack) {
      rc = amqp_basic_ack(conn_.get(), kChannel, tag, 0);
    } else if (delay_ms > 0) {
      // RabbitMQ requeues a nacked message at once: hold it until the delay
      // ran out, then nack it (FlushDueNacksLocked).
      held_.push_back({SaturatingDue(delay_ms), tag});
      return Status::OK();
    } else {
      rc = amqp_basic_nack(conn_.get(), kChannel, tag, /*multiple=*/0, /*requeue=*/1);
    }
    if (rc != AMQP_STATUS_OK) {
      conn_.Reset(false);
      outstanding_.clear();
      held_.clear();
      return Status::LeaseLost(std::string("amqp: ") + (ack ? "ack" : "nack") + " failed, connection to " +
                                    ep_.Where() + " lost (" + amqp_error_string2(rc) +
                                    "): the broker requeues the message");
    }
    return Status::OK();
  }

  // When a delivery received now loses its lease (never without a lease).
  int64_t LeaseEnd() const {
    if (o_.lease_ms <= 0) return std::numeric_limits<int64_t>::max();
    const int64_t now = o_.env->NowMs();
    return now > std::numeric_limits<int64_t>::max() - o_.lease_ms ? std::numeric_limits<int64_t>::max()
                                                                   : now + o_.lease_ms;
  }

  // Gives back (nack, requeue) the deliveries whose lease ran out.
  void ExpireLeasesLocked() {
    if (o_.lease_ms <= 0 || outstanding_.empty() || !conn_) return;
    const int64_t now = o_.env->NowMs();
    for (auto it = outstanding_.begin(); it != outstanding_.end();) {
      if (it->second > now) {
        ++it;
        continue;
      }
      if (amqp_basic_nack(conn_.get(), kChannel, it->first, 0, 1) != AMQP_STATUS_OK) {
        conn_.Reset(false);
        outstanding_.clear();
        held_.clear();
        return;
      }
      it = outstanding_.erase(it);
    }
  }

  int64_t SaturatingDue(int64_t delay_ms) {
    const int64_t delay = std::min(delay_ms, std::max<int64_t>(0, o_.max_nack_delay_ms));
    const int64_t now = o_.env->NowMs();
    return now > std::numeric_limits<int64_t>::max() - delay ? std::numeric_limits<int64_t>::max() : now + delay;
  }

  void FlushDueNacksLocked() {
    if (held_.empty() || !conn_) return;
    const int64_t now = o_.env->NowMs();
    for (size_t i = 0; i < held_.size();) {
      if (held_[i].due_ms > now) {
        ++i;
        continue;
      }
      if (amqp_basic_nack(conn_.get(), kChannel, held_[i].tag, 0, 1) != AMQP_STATUS_OK) {
        conn_.Reset(false);
        outstanding_.clear();
        held_.clear();
        return;
      }
      held_[i] = held_.back();
      held_.pop_back();
    }
  }

  const SourceOptions o_;
  const Endpoint ep_;
  mutable std::mutex mu_;
  Conn conn_;
  uint64_t generation_ = 0;
  bool consuming_ = false;  // basic.consume sent on this connection
  // Delivery tags of this connection received and not yet settled, with
  // the end of their lease (int64 max without leases).
  std::unordered_map<uint64_t, int64_t> outstanding_;
  // Nacked with a delay: nacked for real once due.
  std::vector<Held> held_;
};

class PublisherImpl final : public Publisher {
 public:
  PublisherImpl(PublisherOptions o, Endpoint ep) : o_(std::move(o)), ep_(std::move(ep)) {}
  ~PublisherImpl() override {
    std::lock_guard<std::mutex> l(mu_);
    conn_.Reset(true);
  }

  Status ConnectLocked() {
    seq_ = 0;
    IDEM_RETURN_IF_ERROR(conn_.Open(ep_, 0, o_.timeout_ms));
    if (!o_.declare_queue.empty()) IDEM_RETURN_IF_ERROR(conn_.DeclareQueue(o_.declare_queue, ep_));
    amqp_confirm_select(conn_.get(), kChannel);
    return conn_.Check("confirm.select on " + ep_.Where());
  }

  Status Publish(std::string_view routing_key, const Message& message) override {
    std::lock_guard<std::mutex> l(mu_);
    bool fresh = false;
    if (!conn_) {
      IDEM_RETURN_IF_ERROR(ConnectLocked());
      fresh = true;
    }
    for (const auto& [k, v] : message.headers) {
      if (k.empty())
        return Status::InvalidArgument(
            "amqp: a header with an empty name cannot be published (rabbitmq-c cannot decode it on delivery)");
      if (k.size() > 255) return Status::InvalidArgument("amqp: header name longer than 255 bytes");
    }
    if (message.id.size() > 255) return Status::InvalidArgument("amqp: message id longer than 255 bytes");
    amqp_basic_properties_t props{};
    props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_HEADERS_FLAG;
    props.delivery_mode = 2;  // persistent
    if (!message.id.empty()) {
      props._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
      props.message_id = Bytes(message.id);
    }
    std::vector<amqp_table_entry_t> entries;
    for (const auto& [k, v] : message.headers) {
      amqp_table_entry_t e{};
      e.key = Bytes(k);
      e.value.kind = AMQP_FIELD_KIND_UTF8;
      e.value.value.bytes = Bytes(v);
      entries.push_back(e);
    }
    if (message.producer_time_ms) {
      amqp_table_entry_t e{};
      e.key = Bytes(kProducerTimeHeader);
      e.value.kind = AMQP_FIELD_KIND_I64;
      e.value.value.i64 = *message.producer_time_ms;
      entries.push_back(e);
      props._flags |= AMQP_BASIC_TIMESTAMP_FLAG;
      props.timestamp = static_cast<uint64_t>(std::max<int64_t>(0, *message.producer_time_ms / 1000));
    }
    props.headers.num_entries = static_cast<int>(entries.size());
    props.headers.entries = entries.empty() ? nullptr : entries.data();

    int rc = amqp_basic_publish(conn_.get(), kChannel, Bytes(o_.exchange), Bytes(routing_key), /*mandatory=*/1,
                                /*immediate=*/0, &props, Bytes(message.payload));
    if (rc != AMQP_STATUS_OK && !fresh) {
      // The connection died since the last call. A publish that failed to
      // write never reached the broker whole: reconnect and send it again.
      conn_.Reset(false);
      IDEM_RETURN_IF_ERROR(ConnectLocked());
      rc = amqp_basic_publish(conn_.get(), kChannel, Bytes(o_.exchange), Bytes(routing_key), 1, 0, &props,
                              Bytes(message.payload));
    }
    if (rc != AMQP_STATUS_OK) {
      conn_.Reset(false);
      return Status::Unavailable("amqp: publish to " + ep_.Where() + " failed: " + amqp_error_string2(rc));
    }
    const uint64_t seq = ++seq_;
    return WaitConfirmLocked(seq);
  }

 private:
  Status WaitConfirmLocked(uint64_t seq) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(1, o_.timeout_ms));
    bool returned = false;
    std::string return_text;
    for (;;) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        conn_.Reset(false);  // a late confirm must not be taken for the next message's
        return Status::InDoubt("amqp: no publisher confirm from " + ep_.Where() + " within " +
                               std::to_string(o_.timeout_ms) + " ms: publish again");
      }
      timeval tv = ToTimeval(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1);
      amqp_maybe_release_buffers(conn_.get());
      amqp_frame_t frame;
      int rc = amqp_simple_wait_frame_noblock(conn_.get(), &frame, &tv);
      if (rc == AMQP_STATUS_TIMEOUT) continue;
      if (rc != AMQP_STATUS_OK) {
        conn_.Reset(false);
        return Status::InDoubt("amqp: connection to " + ep_.Where() + " lost before the publisher confirm (" +
                               amqp_error_string2(rc) + "): publish again");
      }
      if (frame.frame_type != AMQP_FRAME_METHOD) continue;
      const amqp_method_t& m = frame.payload.method;
      if (m.id == AMQP_BASIC_ACK_METHOD) {
        auto* a = static_cast<amqp_basic_ack_t*>(m.decoded);
        if (a->delivery_tag == seq || (a->multiple && a->delivery_tag >= seq)) {
          if (returned) return Status::NotFound("amqp: unroutable message: " + return_text);
          return Status::OK();
        }
      } else if (m.id == AMQP_BASIC_NACK_METHOD) {
        auto* n = static_cast<amqp_basic_nack_t*>(m.decoded);
        if (n->delivery_tag == seq || (n->multiple && n->delivery_tag >= seq))
          return Status::Unavailable("amqp: the broker at " + ep_.Where() + " nacked the publish");
      } else if (m.id == AMQP_BASIC_RETURN_METHOD) {
        auto* r = static_cast<amqp_basic_return_t*>(m.decoded);
        returned = true;
        return_text = std::to_string(r->reply_code) + " " + Str(r->reply_text) + " (exchange '" +
                      Str(r->exchange) + "', routing key '" + Str(r->routing_key) + "')";
        // The returned message's content follows: read it and drop it.
        amqp_message_t msg;
        amqp_rpc_reply_t rr = amqp_read_message(conn_.get(), frame.channel, &msg, 0);
        if (rr.reply_type != AMQP_RESPONSE_NORMAL) {
          conn_.Reset(false);
          return Status::InDoubt("amqp: connection to " + ep_.Where() + " lost reading a returned message: " +
                                 ReplyText(rr));
        }
        amqp_destroy_message(&msg);
      } else if (m.id == AMQP_CHANNEL_CLOSE_METHOD || m.id == AMQP_CONNECTION_CLOSE_METHOD) {
        uint16_t code = 0;
        std::string text;
        if (m.id == AMQP_CHANNEL_CLOSE_METHOD) {
          auto* c = static_cast<amqp_channel_close_t*>(m.decoded);
          code = c->reply_code;
          text = Str(c->reply_text);
        } else {
          auto* c = static_cast<amqp_connection_close_t*>(m.decoded);
          code = c->reply_code;
          text = Str(c->reply_text);
        }
        conn_.Reset(false);
        const std::string msg = "amqp: the broker at " + ep_.Where() + " closed the channel: " +
                                std::to_string(code) + " " + text;
        if (code == AMQP_NOT_FOUND) return Status::NotFound(msg);
        return Status::InDoubt(msg + ": publish again");
      }
    }
  }

  const PublisherOptions o_;
  const Endpoint ep_;
  std::mutex mu_;
  Conn conn_;
  uint64_t seq_ = 0;  // the channel's publish sequence number (confirm mode)
};

}  // namespace

std::string Endpoint::Where() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<Endpoint> ParseUrl(std::string_view url) {
  constexpr std::string_view kScheme = "amqp://";
  if (url.substr(0, kScheme.size()) != kScheme) {
    if (url.substr(0, 8) == "amqps://") return Status::InvalidArgument("amqp url: amqps (TLS) is not supported");
    return Status::InvalidArgument("amqp url: must start with amqp://");
  }
  std::string_view rest = url.substr(kScheme.size());
  Endpoint ep;
  ep.user = "guest";
  ep.password = "guest";
  std::string_view path;
  if (size_t slash = rest.find('/'); slash != std::string_view::npos) {
    path = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
  }
  if (size_t at = rest.rfind('@'); at != std::string_view::npos) {
    std::string_view info = rest.substr(0, at);
    rest = rest.substr(at + 1);
    size_t colon = info.find(':');
    IDEM_ASSIGN_OR_RETURN(ep.user, PercentDecode(info.substr(0, colon), "user"));
    if (colon != std::string_view::npos) {
      IDEM_ASSIGN_OR_RETURN(ep.password, PercentDecode(info.substr(colon + 1), "password"));
    } else {
      ep.password.clear();
    }
    if (ep.user.empty()) return Status::InvalidArgument("amqp url: the user before '@' is empty");
  }
  // host, host:port, [v6], [v6]:port
  std::string_view port_text;
  if (!rest.empty() && rest.front() == '[') {
    size_t close = rest.find(']');
    if (close == std::string_view::npos) return Status::InvalidArgument("amqp url: unclosed '[' in the host");
    ep.host = std::string(rest.substr(1, close - 1));
    std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return Status::InvalidArgument("amqp url: junk after the host");
      port_text = after.substr(1);
    }
  } else if (size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    ep.host = std::string(rest.substr(0, colon));
    port_text = rest.substr(colon + 1);
  } else {
    ep.host = std::string(rest);
  }
  if (ep.host.empty()) return Status::InvalidArgument("amqp url: the host is empty");
  if (!port_text.empty()) {
    auto p = ParseInt(port_text);
    if (!p || *p < 1 || *p > 65535)
      return Status::InvalidArgument("amqp url: port '" + std::string(port_text) + "' is not 1..65535");
    ep.port = static_cast<int>(*p);
  } else if (rest.find(':') != std::string_view::npos && rest.back() == ':') {
    return Status::InvalidArgument("amqp url: the port after ':' is empty");
  }
  if (size_t q = path.find('?'); q != std::string_view::npos) path = path.substr(0, q);
  if (!path.empty()) {
    IDEM_ASSIGN_OR_RETURN(ep.vhost, PercentDecode(path, "vhost"));
  }
  return ep;
}

Result<std::unique_ptr<Source>> Source::Open(const SourceOptions& options) {
  IDEM_ASSIGN_OR_RETURN(Endpoint ep, ParseUrl(options.url));
  if (options.queue.empty()) return Status::InvalidArgument("amqp source: the queue name is empty");
  if (options.queue.size() > 255) return Status::InvalidArgument("amqp source: the queue name is longer than 255 bytes");
  if (options.prefetch < 1 || options.prefetch > 65535)
    return Status::InvalidArgument("amqp source: prefetch must be 1..65535, not " + std::to_string(options.prefetch));
  if (options.queue_type != "classic" && options.queue_type != "quorum" && !options.queue_type.empty())
    return Status::InvalidArgument("amqp source: queue_type must be classic or quorum, not '" + options.queue_type + "'");
  if (options.lease_ms < 0) return Status::InvalidArgument("amqp source: lease_ms must be >= 0");
  if (options.heartbeat_s < 0 || options.heartbeat_s > 65535)
    return Status::InvalidArgument("amqp source: heartbeat_s must be 0..65535");
  SourceOptions o = options;
  if (o.env == nullptr) o.env = Env::Default();
  if (o.connect_timeout_ms <= 0) o.connect_timeout_ms = 5'000;
  auto src = std::make_unique<SourceImpl>(std::move(o), std::move(ep));
  {
    Status s = src->Reconnect();
    if (!s.ok()) return s;
  }
  return std::unique_ptr<Source>(std::move(src));
}

Result<std::unique_ptr<Publisher>> Publisher::Open(const PublisherOptions& options) {
  IDEM_ASSIGN_OR_RETURN(Endpoint ep, ParseUrl(options.url));
  PublisherOptions o = options;
  if (o.timeout_ms <= 0) o.timeout_ms = 5'000;
  auto pub = std::make_unique<PublisherImpl>(std::move(o), std::move(ep));
  {
    Status s = pub->ConnectLocked();  // not shared yet: no lock needed
    if (!s.ok()) return s;
  }
  return std::unique_ptr<Publisher>(std::move(pub));
}

}  // namespace idem::amqp
