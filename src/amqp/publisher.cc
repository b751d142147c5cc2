// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::amqp::Publisher on rabbitmq-c 0.11: one connection in confirm mode,
// channel 1, behind a mutex.
#include "idem/amqp/publisher.h"

#include <algorithm>
#include <chrono>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "amqp/conn.h"
#include "core/options_check.h"
#include "core/publish_batch.h"

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
    if (o_.declare_queue && !o_.queue.empty()) IDEM_RETURN_IF_ERROR(conn_.DeclareQueue(o_.queue, ep_, o_.queue_type));
    amqp_confirm_select(conn_.get(), kChannel);
    return conn_.Check("confirm.select on " + ep_.Where());
  }

  Status Publish(const Message& message) override {
    if (o_.queue.empty()) return publish_internal::NoChannel("amqp", "queue");
    return Publish(o_.queue, message);
  }

  Status Publish(std::string_view routing_key, const Message& message) override {
    if (Status s = CheckMessage(message); !s.ok()) return s;
    Item item{routing_key, &message, {}};
    std::lock_guard<std::mutex> l(mu_);
    SendAndConfirmLocked(std::span<Item>(&item, 1));
    return item.status;
  }

  // Every message on the confirm channel first, then the confirms, mapped
  // to the elements by delivery tag.
  std::vector<Status> PublishBatch(std::span<const Outgoing> batch) override {
    std::vector<Status> out(batch.size());
    std::vector<Item> items;
    std::vector<size_t> index;  // the element of each item
    items.reserve(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      auto d = publish_internal::Destination(batch[i], o_.queue, "amqp", "queue");
      Status s = d.ok() ? CheckMessage(*batch[i].message) : d.status();
      if (!s.ok()) {
        out[i] = s;
        continue;
      }
      items.push_back({*d, batch[i].message, batch[i].key});
      index.push_back(i);
    }
    if (items.empty()) return out;
    {
      std::lock_guard<std::mutex> l(mu_);
      SendAndConfirmLocked(items);
    }
    for (size_t k = 0; k < items.size(); ++k) out[index[k]] = std::move(items[k].status);
    return out;
  }

  PublisherTraits traits() const override { return {.ordered_batch = false, .max_batch = 500}; }
  std::string_view Channel() const override { return o_.queue; }

 private:
  // One message to publish and, afterwards, what became of it.
  struct Item {
    std::string_view routing_key;
    const Message* message;
    std::string_view key;  // the ordering key; empty: no header
    Status status = Status::InDoubt("amqp: not confirmed");
    uint64_t tag = 0;  // its publish sequence number, once sent
    bool confirmed = false;
    std::string returned;  // why the broker returned it (unroutable)
  };

  // kInvalidArgument for what rabbitmq-c cannot carry.
  static Status CheckMessage(const Message& message) {
    for (const auto& [k, v] : message.headers) {
      if (k.empty())
        return Status::InvalidArgument(
            "amqp: a header with an empty name cannot be published (rabbitmq-c cannot decode it on delivery)");
      if (k.size() > 255) return Status::InvalidArgument("amqp: header name longer than 255 bytes");
    }
    if (message.id.size() > 255) return Status::InvalidArgument("amqp: message id longer than 255 bytes");
    return Status::OK();
  }

  // basic.publish of one item (persistent, mandatory); rabbitmq-c's code.
  int BasicPublishLocked(const Item& item) {
    const Message& message = *item.message;
    amqp_basic_properties_t props{};
    props._flags = AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_HEADERS_FLAG;
    props.delivery_mode = 2;  // persistent
    if (!message.id.empty()) {
      props._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
      props.message_id = Bytes(message.id);
    }
    std::vector<amqp_table_entry_t> entries;
    auto add = [&](std::string_view k, std::string_view v) {
      amqp_table_entry_t e{};
      e.key = Bytes(k);
      e.value.kind = AMQP_FIELD_KIND_UTF8;
      e.value.value.bytes = Bytes(v);
      entries.push_back(e);
    };
    for (const auto& [k, v] : message.headers) add(k, v);
    if (!item.key.empty()) add(kOrderingKeyHeader, item.key);
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
    return amqp_basic_publish(conn_.get(), kChannel, Bytes(o_.exchange), Bytes(item.routing_key), /*mandatory=*/1,
                              /*immediate=*/0, &props, Bytes(message.payload));
  }

  // Publishes every item, then waits for their confirms. Each item's status:
  // OK (acked); kRejected (returned as unroutable, then acked; or the
  // channel closed with 404, no such exchange); kUnavailable (nacked, or
  // never sent); kInDoubt (sent, then the channel or the connection was
  // lost or no confirm came in time: the next call reconnects).
  void SendAndConfirmLocked(std::span<Item> items) {
    bool fresh = false;
    if (!conn_) {
      if (Status s = ConnectLocked(); !s.ok()) {
        for (Item& it : items) it.status = s;
        return;
      }
      fresh = true;
    }
    size_t sent = 0;
    for (; sent < items.size(); ++sent) {
      int rc = BasicPublishLocked(items[sent]);
      if (rc != AMQP_STATUS_OK && sent == 0 && !fresh) {
        // The connection died since the last call. A publish that failed to
        // write never reached the broker whole: reconnect and send it again.
        conn_.Reset(false);
        if (Status s = ConnectLocked(); !s.ok()) {
          for (Item& it : items) it.status = s;
          return;
        }
        rc = BasicPublishLocked(items[sent]);
      }
      if (rc != AMQP_STATUS_OK) {
        conn_.Reset(false);
        const std::string why = "amqp: publish to " + ep_.Where() + " failed: " + amqp_error_string2(rc);
        // The first never went out whole; later ones may follow sent ones.
        for (size_t k = 0; k < sent; ++k) items[k].status = Status::InDoubt(why + ": publish again");
        for (size_t k = sent; k < items.size(); ++k) items[k].status = Status::Unavailable(why);
        return;
      }
      items[sent].tag = ++seq_;
    }
    WaitConfirmsLocked(items);
  }

  // Settles every item of tag <= `tag` (or just `tag`) not settled yet.
  static size_t Settle(std::span<Item> items, uint64_t tag, bool multiple, bool ack, const std::string& nack_text) {
    size_t n = 0;
    for (Item& it : items) {
      if (it.confirmed || !(it.tag == tag || (multiple && it.tag < tag))) continue;
      it.confirmed = true;
      ++n;
      if (!ack)
        it.status = Status::Unavailable(nack_text);
      else if (!it.returned.empty())
        it.status = Status::Rejected("amqp: unroutable: no queue takes routing key '" + std::string(it.routing_key) +
                                     "': " + it.returned);
      else
        it.status = Status::OK();
    }
    return n;
  }

  void WaitConfirmsLocked(std::span<Item> items) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(1, o_.connect_timeout_ms));
    size_t open = items.size();
    auto fail_open = [&](const Status& s) {
      conn_.Reset(false);  // a late confirm must not be taken for the next message's
      for (Item& it : items)
        if (!it.confirmed) it.status = s;
    };
    while (open > 0) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline)
        return fail_open(Status::InDoubt("amqp: no publisher confirm from " + ep_.Where() + " within " +
                                         std::to_string(o_.connect_timeout_ms) + " ms: publish again"));
      timeval tv = ToTimeval(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1);
      amqp_maybe_release_buffers(conn_.get());
      amqp_frame_t frame;
      int rc = amqp_simple_wait_frame_noblock(conn_.get(), &frame, &tv);
      if (rc == AMQP_STATUS_TIMEOUT) continue;
      if (rc != AMQP_STATUS_OK)
        return fail_open(Status::InDoubt("amqp: connection to " + ep_.Where() + " lost before the publisher confirm (" +
                                         amqp_error_string2(rc) + "): publish again"));
      if (frame.frame_type != AMQP_FRAME_METHOD) continue;
      const amqp_method_t& m = frame.payload.method;
      if (m.id == AMQP_BASIC_ACK_METHOD) {
        auto* a = static_cast<amqp_basic_ack_t*>(m.decoded);
        open -= Settle(items, a->delivery_tag, a->multiple, true, {});
      } else if (m.id == AMQP_BASIC_NACK_METHOD) {
        auto* n = static_cast<amqp_basic_nack_t*>(m.decoded);
        open -= Settle(items, n->delivery_tag, n->multiple, false,
                       "amqp: the broker at " + ep_.Where() + " nacked the publish");
      } else if (m.id == AMQP_BASIC_RETURN_METHOD) {
        auto* r = static_cast<amqp_basic_return_t*>(m.decoded);
        const std::string routing_key = Str(r->routing_key);
        std::string text = std::to_string(r->reply_code) + " " + Str(r->reply_text) + " (exchange '" +
                           Str(r->exchange) + "', routing key '" + routing_key + "')";
        // The returned message's content follows: its message-id and
        // routing key name the item (the return comes before its ack).
        amqp_message_t msg;
        amqp_rpc_reply_t rr = amqp_read_message(conn_.get(), frame.channel, &msg, 0);
        if (rr.reply_type != AMQP_RESPONSE_NORMAL)
          return fail_open(Status::InDoubt("amqp: connection to " + ep_.Where() +
                                           " lost reading a returned message: " + ReplyText(rr)));
        const std::string id =
            (msg.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG) ? Str(msg.properties.message_id) : std::string();
        amqp_destroy_message(&msg);
        for (Item& it : items)
          if (!it.confirmed && it.returned.empty() && it.routing_key == routing_key && it.message->id == id) {
            it.returned = std::move(text);
            break;
          }
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
        const std::string msg =
            "amqp: the broker at " + ep_.Where() + " closed the channel: " + std::to_string(code) + " " + text;
        return fail_open(code == AMQP_NOT_FOUND ? Status::Rejected(msg) : Status::InDoubt(msg + ": publish again"));
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
  IDEM_ASSIGN_OR_RETURN(Endpoint ep, amqp_internal::ParseEndpoint(options.url));
  IDEM_RETURN_IF_ERROR(amqp_internal::CheckQueueFields("amqp publisher", options.queue, options.queue_type));
  IDEM_RETURN_IF_ERROR(
      options_internal::AtLeast("amqp publisher", "connect_timeout_ms", options.connect_timeout_ms, 1));
  auto pub = std::make_unique<PublisherImpl>(options, std::move(ep));
  {
    Status s = pub->ConnectLocked();  // not shared yet: no lock needed
    if (!s.ok()) return s;
  }
  return std::unique_ptr<Publisher>(std::move(pub));
}

}  // namespace idem::amqp
