// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: RAII wrappers over hiredis (blocking contexts), the URL parser,
// the one hiredis error translation, and a small connection pool. Never
// included from a public header.
#ifndef IDEM_SRC_REDIS_CLIENT_H_
#define IDEM_SRC_REDIS_CLIENT_H_

#include <hiredis.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "idem/result.h"
#include "idem/status.h"

namespace idem::redis_internal {

// Where and how to connect, from a redis:// URL.
struct Endpoint {
  std::string host;
  int port = 6379;
  std::string user;      // ACL user for AUTH; "" for the default user
  std::string password;  // "" for no AUTH
  int db = 0;            // SELECT, when not 0
  // "host:port" ("[v6]:port"), for messages.
  std::string Address() const;
};

// Parses "redis://[[user]:password@]host[:port][/db]". Errors
// (kInvalidArgument) show the URL with its password redacted.
Result<Endpoint> ParseUrl(std::string_view url);

// The one place where hiredis errors become idem codes. `context_err` is a
// redisContext's err (REDIS_ERR_IO, ...; 0 when the connection is fine);
// otherwise `reply_error` is the text of an error reply ("WRONGPASS ...").
Code CodeFor(int context_err, std::string_view reply_error);
// The same as a Status: "<what>: <detail>". `reply` is what the command
// returned (nullptr when the connection failed: `ctx` says why). OK when the
// reply is not an error.
Status Translate(const redisContext* ctx, const redisReply* reply, std::string_view what);

struct ReplyDeleter {
  void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;
struct ContextDeleter {
  void operator()(redisContext* c) const noexcept { redisFree(c); }
};
using ContextPtr = std::unique_ptr<redisContext, ContextDeleter>;

// A Lua script run with EVALSHA. Scripts are static: a connection remembers
// which it has loaded by address.
struct Script {
  const char* name;
  const char* body;
};

struct ConnectOptions {
  int connect_timeout_ms = 5'000;
  int command_timeout_ms = 5'000;
  std::string client_name;  // CLIENT SETNAME when not empty
};

// OK, or InvalidArgument when Redis would refuse `name` for CLIENT SETNAME.
Status ValidateClientName(std::string_view name);

// One blocking connection. One thread at a time.
class Conn {
 public:
  // Connects, then AUTH and SELECT as the endpoint says. Errors:
  // kUnavailable naming host:port (unreachable, refused, wrong password: the
  // password is never echoed), kInvalidArgument (no such database).
  static Result<std::unique_ptr<Conn>> Connect(const Endpoint& endpoint, const ConnectOptions& options);
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;

  // False once hiredis reported an I/O or protocol error, or while replies
  // of pipelined commands are unread (a caller gave up half way): the
  // connection is then unusable and must be dropped.
  bool healthy() const { return ctx_->err == 0 && pending_ == 0; }
  const std::string& address() const { return address_; }

  // Runs one command. An error reply becomes a Status.
  Result<ReplyPtr> Command(std::span<const std::string_view> args);
  Result<ReplyPtr> Command(std::initializer_list<std::string_view> args) {
    return Command(std::span<const std::string_view>(args.begin(), args.size()));
  }
  // Runs `script` with EVALSHA, loading it (SCRIPT LOAD) on its first use on
  // this connection and again after NOSCRIPT (a restarted or flushed server).
  Result<ReplyPtr> Eval(const Script& script, std::span<const std::string> keys, std::span<const std::string> args);
  // Loads `script` now (as Eval would on first use).
  Status Preload(const Script& script);
  // Pipelining: Append queues a command; Read sends what is queued and
  // returns the next reply (an error reply is returned as a Status).
  Status Append(std::span<const std::string_view> args);
  Result<ReplyPtr> Read(std::string_view what);
  // Sends what Append queued, without reading.
  Status Flush(std::string_view what);
  // As Read, but an error reply is returned as a reply. For replies to
  // commands already sent with Flush.
  Result<ReplyPtr> ReadReply(std::string_view what);
  // The SHA1 of a script loaded with Preload; nullptr when it is not loaded.
  const std::string* LoadedSha(const Script& script) const;
  // "Redis at host:port: <what>" as the context to `reply` (nullptr: the
  // connection's error).
  Status Fail(const redisReply* reply, std::string_view what) const;
  // Waits up to max_wait_ms for the next reply (a subscriber's message) and
  // discards it; whether one came. Unlike a read timeout, running out of
  // time leaves the connection usable.
  bool AwaitReply(int64_t max_wait_ms);

 private:
  Conn(ContextPtr ctx, std::string address) : ctx_(std::move(ctx)), address_(std::move(address)) {}
  // Sends one command and reads its reply, which may be an error reply. Only
  // a broken connection is an error here.
  Result<ReplyPtr> Call(std::span<const std::string_view> args, std::string_view what);
  Result<std::string> Load(const Script& script);

  ContextPtr ctx_;
  std::string address_;
  std::unordered_map<const Script*, std::string> sha_;  // loaded scripts
  int pending_ = 0;                                     // appended, not yet read
};

// Idle connections for reuse. Take() gives one (opening one when none is
// idle); the Lease puts it back, unless it broke or the pool is full.
class Pool {
 public:
  struct Options {
    ConnectOptions connect;
    int size = 8;
    // After a failed connect, Take() answers that failure at once for this
    // long instead of trying again. 0: always try.
    int retry_after_ms = 0;
  };
  Pool(Endpoint endpoint, Options options) : endpoint_(std::move(endpoint)), options_(std::move(options)) {}
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  class Lease {
   public:
    Lease(Pool* pool, std::unique_ptr<Conn> conn) : pool_(pool), conn_(std::move(conn)) {}
    Lease(Lease&& other) noexcept = default;
    Lease& operator=(Lease&&) = delete;
    ~Lease() {
      if (pool_ != nullptr && conn_ != nullptr) pool_->Give(std::move(conn_));
    }
    Conn* operator->() { return conn_.get(); }
    Conn& operator*() { return *conn_; }

   private:
    Pool* pool_;
    std::unique_ptr<Conn> conn_;
  };

  Result<Lease> Take();
  // A connection of its own, outside the pool (a subscriber).
  Result<std::unique_ptr<Conn>> Open();
  const Endpoint& endpoint() const { return endpoint_; }

 private:
  void Give(std::unique_ptr<Conn> conn);

  const Endpoint endpoint_;
  const Options options_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Conn>> idle_;
  // retry_after_ms: the last connect failure and until when it stands.
  Status last_failure_;
  std::chrono::steady_clock::time_point retry_at_{};
};

// Automatic pipelining of EVALSHA calls (and plain commands) from many threads over a few shared
// connections: callers that arrive while a batch is on the wire queue up;
// the next leader (one of them) writes the whole queue at once and reads the
// replies back in order, so the server and the clients make a few syscalls
// per batch instead of a few per call. Each connection has every script of
// `scripts` loaded when it opens; NOSCRIPT (a flushed or restarted server)
// loads the script again and retries that call. A broken connection fails
// every call in flight on it (kUnavailable: the command may or may not have
// run) and is replaced by the next batch.
class Pipeline {
 public:
  Pipeline(Endpoint endpoint, ConnectOptions options, std::vector<const Script*> scripts, int connections);
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;
  ~Pipeline();

  // Opens the first connection (loading the scripts), so that a wrong URL or
  // password shows at once.
  Status Connect();
  // Runs `script` (one of `scripts`) with EVALSHA. An error reply becomes a
  // Status, as with Conn::Eval.
  Result<ReplyPtr> Eval(const Script& script, std::span<const std::string> keys, std::span<const std::string> args);
  // Runs `script` once per call, all queued together on one connection (one
  // round trip when nothing else is on the wire): one reply per call, in
  // order, each as Eval would answer it.
  struct EvalCall {
    std::span<const std::string> keys;
    std::span<const std::string> args;
  };
  std::vector<Result<ReplyPtr>> EvalMany(const Script& script, std::span<const EvalCall> calls);
  // Runs plain commands (each an argv), queued together in one batch, so
  // they run in this order on one connection (other clients' commands may
  // come between them). Their replies, in order; an error reply of any of
  // them becomes the Status.
  Result<std::vector<ReplyPtr>> Commands(std::span<const std::vector<std::string_view>> commands);

 private:
  struct Request;
  struct Lane;
  Result<std::unique_ptr<Conn>> Open();
  // Queues `reqs` on the calling thread's lane and returns once every
  // result is in.
  void Submit(std::span<Request* const> reqs);
  // The leader's turn: reads the lane's batch in flight, hands its results
  // out, and passes the next batch (written at once) to one of its callers.
  void Lead(Lane& lane);
  void WriteBatch(Lane& lane, std::span<Request* const> batch);
  void ReadBatch(Lane& lane, std::span<Request* const> batch);

  const Endpoint endpoint_;
  const ConnectOptions options_;
  const std::vector<const Script*> scripts_;
  std::vector<std::unique_ptr<Lane>> lanes_;
};

// Helpers for building keys and reading replies.
// "<n>:<bytes>" so that no choice of bytes makes two names collide.
std::string LengthPrefixed(std::string_view s);
// `s` with the glob characters of SCAN MATCH escaped.
std::string GlobEscape(std::string_view s);
std::string_view ReplyString(const redisReply* r);  // "" unless a string/status
// An integer reply, or a string one holding an integer.
Result<int64_t> ReplyInt(const redisReply* r, std::string_view what);

}  // namespace idem::redis_internal

#endif  // IDEM_SRC_REDIS_CLIENT_H_
