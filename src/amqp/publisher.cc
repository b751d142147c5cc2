// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::amqp::Publisher on rabbitmq-c 0.11: one connection in confirm mode,
// channel 1, behind a mutex.
#include "idem/amqp/publisher.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "amqp/conn.h"

namespace idem::amqp {
namespace {

using namespace amqp_internal;  // NOLINT: the shared connection code

class PublisherImpl final : public Publisher {
 public:
  PublisherImpl(Options o, Endpoint ep) : o_(std::move(o)), ep_(std::move(ep)) {}
  ~PublisherImpl() override {
    std::lock_guard<std::mutex> l(mu_);
    conn_.Reset(true);
  }

  Status ConnectLocked() {
    seq_ = 0;
    IDEM_RETURN_IF_ERROR(conn_.Open(ep_, 0, o_.connect_timeout_ms));
    if (o_.declare_queue) IDEM_RETURN_IF_ERROR(conn_.DeclareQueue(o_.queue, ep_, o_.queue_type));
    amqp_confirm_select(conn_.get(), kChannel);
    return conn_.Check("confirm.select on " + ep_.Where());
  }

  Status Publish(const Message& message) override {
    if (o_.queue.empty())
      return Status::InvalidArgument("amqp publisher: Options::queue is empty (no routing key for Publish(message))");
    return Publish(o_.queue, message);
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
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(1, o_.connect_timeout_ms));
    bool returned = false;
    std::string return_text;
    for (;;) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        conn_.Reset(false);  // a late confirm must not be taken for the next message's
        return Status::InDoubt("amqp: no publisher confirm from " + ep_.Where() + " within " +
                               std::to_string(o_.connect_timeout_ms) + " ms: publish again");
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
        return_text = std::to_string(r->reply_code) + " " + Str(r->reply_text) + " (exchange '" + Str(r->exchange) +
                      "', routing key '" + Str(r->routing_key) + "')";
        // The returned message's content follows: read it and drop it.
        amqp_message_t msg;
        amqp_rpc_reply_t rr = amqp_read_message(conn_.get(), frame.channel, &msg, 0);
        if (rr.reply_type != AMQP_RESPONSE_NORMAL) {
          conn_.Reset(false);
          return Status::InDoubt("amqp: connection to " + ep_.Where() +
                                 " lost reading a returned message: " + ReplyText(rr));
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
        const std::string msg =
            "amqp: the broker at " + ep_.Where() + " closed the channel: " + std::to_string(code) + " " + text;
        if (code == AMQP_NOT_FOUND) return Status::NotFound(msg);
        return Status::InDoubt(msg + ": publish again");
      }
    }
  }

  const Options o_;
  const Endpoint ep_;
  std::mutex mu_;
  Conn conn_;
  uint64_t seq_ = 0;  // the channel's publish sequence number (confirm mode)
};

}  // namespace

Result<std::unique_ptr<Publisher>> Publisher::Open(const Options& options) {
  IDEM_ASSIGN_OR_RETURN(Endpoint ep, amqp::ParseUrl(options.url));
  if (options.queue.size() > 255)
    return Status::InvalidArgument("amqp publisher: the queue name is longer than 255 bytes");
  if (options.declare_queue && options.queue.empty())
    return Status::InvalidArgument("amqp publisher: declare_queue needs a queue");
  if (options.queue_type != "classic" && options.queue_type != "quorum" && !options.queue_type.empty())
    return Status::InvalidArgument("amqp publisher: queue_type must be classic or quorum, not '" + options.queue_type +
                                   "'");
  Options o = options;
  if (o.connect_timeout_ms <= 0) o.connect_timeout_ms = 5'000;
  auto pub = std::make_unique<PublisherImpl>(std::move(o), std::move(ep));
  {
    Status s = pub->ConnectLocked();  // not shared yet: no lock needed
    if (!s.ok()) return s;
  }
  return std::unique_ptr<Publisher>(std::move(pub));
}

}  // namespace idem::amqp
