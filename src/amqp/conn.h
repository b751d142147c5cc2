// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: the rabbitmq-c connection the amqp Source and Publisher share
// (one connection, channel 1), and the small conversions around it. Never
// included from a public header.
#ifndef IDEM_SRC_AMQP_CONN_H_
#define IDEM_SRC_AMQP_CONN_H_

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#include <sys/time.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "idem/amqp/source.h"
#include "idem/result.h"
#include "idem/status.h"

namespace idem::amqp_internal {

// A parsed "amqp://user:password@host:port/vhost" (percent-escapes decoded;
// "/%2f" or no path is the vhost "/"). Defaults: guest:guest, port 5672.
struct Endpoint {
  std::string host;
  int port = 5672;
  std::string user;
  std::string password;
  std::string vhost = "/";
  // "host:port" (what error messages name; never the password).
  std::string Where() const;
};
// kInvalidArgument naming what is wrong (never echoing the password).
Result<Endpoint> ParseEndpoint(std::string_view url);
// The queue fields a Source and a Publisher share: a queue name of at most
// 255 bytes, a queue_type of "classic", "quorum" or empty. `what` names the
// class ("amqp source").
Status CheckQueueFields(std::string_view what, std::string_view queue, std::string_view queue_type);

inline constexpr amqp_channel_t kChannel = 1;

timeval ToTimeval(int64_t ms);
amqp_bytes_t Bytes(std::string_view s);
std::string Str(amqp_bytes_t b);
// The text of an RPC reply that is not normal (for messages).
std::string ReplyText(const amqp_rpc_reply_t& r);
// The AMQP reply code of a server exception (0 otherwise).
int ReplyCode(const amqp_rpc_reply_t& r);
// An RPC reply that is not normal as a Status naming `what`: the one place
// rabbitmq-c replies become idem Status codes.
Status Translate(const amqp_rpc_reply_t& r, const std::string& what);
// Renders a header value as a string; nullopt for kinds with no plain text.
std::optional<std::string> FieldString(const amqp_field_value_t& v);
// A decimal integer, all of `s`.
std::optional<int64_t> ParseInt(std::string_view s);

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
      // The reply's text lives in the connection's memory: read it before
      // the connection is freed. The password is never part of the message.
      Status s = Translate(r, "login as '" + ep.user + "' to " + ep.Where() + " vhost '" + ep.vhost + "'");
      Reset(false);
      return s.code() == Code::kUnavailable ? s : Status::Unavailable(s.message());
    }
    amqp_channel_open(st, kChannel);
    r = amqp_get_rpc_reply(st);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
      Status s = Translate(r, "channel.open on " + ep.Where());  // before the reply's memory is freed
      Reset(false);
      return s;
    }
    return Status::OK();
  }

  // After an RPC: OK, or the error (and the connection is dropped).
  Status Check(const std::string& what) {
    amqp_rpc_reply_t r = amqp_get_rpc_reply(st_);
    if (r.reply_type == AMQP_RESPONSE_NORMAL) return Status::OK();
    Status s = Translate(r, what);
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

}  // namespace idem::amqp_internal

#endif  // IDEM_SRC_AMQP_CONN_H_
