// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::amqp::Source on rabbitmq-c 0.11 (Debian's librabbitmq-dev): one
// connection and one channel (1) per Source, behind a mutex.
#include "idem/amqp/source.h"

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "amqp/conn.h"
#include "amqp/decode.h"
#include "core/options_check.h"

namespace idem::amqp {
namespace {

using namespace amqp_internal;  // NOLINT: the shared connection code

class SourceImpl final : public Source {
 public:
  SourceImpl(Options o, Endpoint ep) : o_(std::move(o)), ep_(std::move(ep)) {}
  ~SourceImpl() override {
    std::lock_guard<std::mutex> l(mu_);
    conn_.Reset(true);
  }

  Status ConnectLocked() {
    outstanding_.clear();
    held_.clear();
    IDEM_RETURN_IF_ERROR(conn_.Open(ep_, static_cast<int>((o_.heartbeat_ms + 999) / 1000), o_.connect_timeout_ms));
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
    const int64_t deadline = wait_ms > std::numeric_limits<int64_t>::max() - start
                                 ? std::numeric_limits<int64_t>::max()
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

  // The optional client-side lease (Source::Options::lease_ms): 0 without one.
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
    d.message = DecodeMessage(env.message.properties, env.message.body, env.redelivered != 0, o_.id_header);
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
      return Status::LeaseLost("amqp: delivery " + std::to_string(tag) + " came on connection " + std::to_string(gen) +
                               ", which is gone: the broker requeued the message");
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
                               ep_.Where() + " lost (" + amqp_error_string2(rc) + "): the broker requeues the message");
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

  const Options o_;
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

}  // namespace

Result<std::unique_ptr<Source>> Source::Open(const Options& options) {
  IDEM_ASSIGN_OR_RETURN(Endpoint ep, amqp_internal::ParseEndpoint(options.url));
  using options_internal::AtLeast;
  using options_internal::InRange;
  constexpr std::string_view kWhat = "amqp source";
  IDEM_RETURN_IF_ERROR(options_internal::NotEmpty(kWhat, "queue", options.queue));
  IDEM_RETURN_IF_ERROR(CheckQueueFields(kWhat, options.queue, options.queue_type));
  IDEM_RETURN_IF_ERROR(InRange(kWhat, "prefetch", options.prefetch, 1, 65535));
  IDEM_RETURN_IF_ERROR(AtLeast(kWhat, "lease_ms", options.lease_ms, 0));
  IDEM_RETURN_IF_ERROR(InRange(kWhat, "heartbeat_ms", options.heartbeat_ms, 0, 65'535'000));
  IDEM_RETURN_IF_ERROR(AtLeast(kWhat, "connect_timeout_ms", options.connect_timeout_ms, 1));
  IDEM_RETURN_IF_ERROR(AtLeast(kWhat, "max_nack_delay_ms", options.max_nack_delay_ms, 0));
  Options o = options;
  if (o.env == nullptr) o.env = Env::Default();
  auto src = std::make_unique<SourceImpl>(std::move(o), std::move(ep));
  {
    Status s = src->Reconnect();
    if (!s.ok()) return s;
  }
  return std::unique_ptr<Source>(std::move(src));
}

}  // namespace idem::amqp
