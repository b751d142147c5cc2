// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "redis/client.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <thread>

#include "idem/url.h"

namespace idem::redis_internal {
namespace {

timeval ToTimeval(int ms) {
  if (ms <= 0) ms = 5'000;
  timeval tv{};
  tv.tv_sec = ms / 1000;
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  return tv;
}

// hiredis writes with write(2): a peer that closed the connection would
// SIGPIPE (and by default kill) the whole process. Like libpq, block SIGPIPE
// in this thread around each exchange and swallow one that it raised,
// leaving the application's own signal setup alone.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    blocked_ = pthread_sigmask(SIG_BLOCK, &pipe, &old_) == 0;
  }
  ~SigpipeGuard() {
    if (!blocked_) return;
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{};
      while (sigtimedwait(&pipe, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t old_{};
  bool blocked_ = false;
  bool was_pending_ = false;
};

Status Invalid(std::string_view url, std::string_view why) {
  return Status::InvalidArgument("bad Redis URL '" + RedactUrl(url) + "': " + std::string(why));
}

}  // namespace

std::string Endpoint::Address() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return h + ":" + std::to_string(port);
}

Result<Endpoint> ParseUrl(std::string_view url) {
  const std::string scheme = UrlScheme(url);
  if (scheme == "rediss") return Invalid(url, "TLS (rediss://) is not supported");
  if (scheme != "redis" || !url.substr(scheme.size()).starts_with("://"))
    return Invalid(url, "expected redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]");
  IDEM_ASSIGN_OR_RETURN(ParsedUrl u, idem::ParseUrl(url, "Redis URL"));
  if (!u.query.empty()) return Invalid(url, "unknown option '" + u.query.front().first + "' (a Redis URL takes none)");
  if (u.hosts.size() != 1) return Invalid(url, "a Redis URL names one host");
  Endpoint ep;
  if (u.has_user) {
    if (!u.has_password)
      return Invalid(url, "write the password as redis://:PASSWORD@host or redis://USER:PASSWORD@host");
    if (u.password.empty()) return Invalid(url, "the password after ':' is empty");
    ep.user = u.user;
    ep.password = u.password;
  }
  ep.host = u.hosts[0].host;
  if (u.hosts[0].port != 0) ep.port = u.hosts[0].port;
  std::string_view db = u.path;
  if (db.starts_with('/')) db.remove_prefix(1);
  if (!db.empty()) {
    auto [p, ec] = std::from_chars(db.data(), db.data() + db.size(), ep.db);
    if (ec != std::errc() || p != db.data() + db.size() || ep.db < 0 || ep.db > (1 << 20))
      return Invalid(url, "the database is not a number");
  }
  return ep;
}

Code CodeFor(int context_err, std::string_view e) {
  switch (context_err) {
    case 0: break;
    case REDIS_ERR_IO:
    case REDIS_ERR_EOF:
    case REDIS_ERR_OTHER:  // connect failures: refused, unresolvable host
      return Code::kUnavailable;
    case REDIS_ERR_OOM: return Code::kRetryable;
    case REDIS_ERR_PROTOCOL:
    default: return Code::kInternal;
  }
  auto is = [&](std::string_view prefix) { return e.starts_with(prefix); };
  if (is("NOAUTH") || is("WRONGPASS") || is("NOPERM")) return Code::kUnavailable;
  if (is("LOADING") || is("MASTERDOWN") || is("READONLY") || is("OOM")) return Code::kUnavailable;
  if (is("BUSY")) return Code::kBusy;  // a long script runs on the server
  if (is("TRYAGAIN")) return Code::kRetryable;
  if (is("MOVED") || is("ASK") || is("CROSSSLOT") || is("CLUSTERDOWN")) return Code::kInvalidArgument;
  if (is("NOSCRIPT")) return Code::kNotFound;
  if (is("WRONGTYPE")) return Code::kCorruption;  // a key under our prefix that idem did not write
  return Code::kInternal;                         // ERR ...: a script or command error is our bug
}

Status Translate(const redisContext* ctx, const redisReply* reply, std::string_view what) {
  if (reply != nullptr && reply->type != REDIS_REPLY_ERROR) return Status::OK();
  std::string m(what);
  m += ": ";
  if (reply == nullptr) {
    const int err = ctx != nullptr ? ctx->err : REDIS_ERR_OTHER;
    std::string detail = ctx != nullptr && ctx->errstr[0] != '\0' ? ctx->errstr : "no reply";
    // A read timeout shows as EAGAIN on a blocking socket.
    if (detail == std::strerror(EAGAIN) || detail == std::strerror(EWOULDBLOCK)) detail = "timed out";
    m += detail;
    if (err == REDIS_ERR_IO || err == REDIS_ERR_EOF) m += " (connection lost; the command may or may not have run)";
    return Status(CodeFor(err == 0 ? REDIS_ERR_OTHER : err, ""), std::move(m));
  }
  std::string_view e(reply->str, reply->len);
  m += e;
  Code code = CodeFor(0, e);
  if (code == Code::kInvalidArgument) m += " (Redis Cluster is not supported: use one server or a primary)";
  return Status(code, std::move(m));
}

Status ValidateClientName(std::string_view name) {
  for (char c : name) {
    if (c <= ' ' || c > '~')
      return Status::InvalidArgument("Redis client name '" + std::string(name) +
                                     "' may hold only printable characters other than space");
  }
  return Status::OK();
}

// ---- Conn

Result<std::unique_ptr<Conn>> Conn::Connect(const Endpoint& ep, const ConnectOptions& o) {
  const std::string where = "Redis at " + ep.Address();
  ContextPtr ctx(redisConnectWithTimeout(ep.host.c_str(), ep.port, ToTimeval(o.connect_timeout_ms)));
  if (ctx == nullptr) return Status::Unavailable("cannot connect to " + where + ": out of memory");
  if (ctx->err != 0) return Status::Unavailable("cannot connect to " + where + ": " + ctx->errstr);
  if (redisSetTimeout(ctx.get(), ToTimeval(o.command_timeout_ms)) != REDIS_OK)
    return Status::Unavailable("cannot set the timeout of the connection to " + where);
  (void)redisEnableKeepAlive(ctx.get());  // detects a vanished server on idle pooled connections
  std::unique_ptr<Conn> conn(new Conn(std::move(ctx), ep.Address()));
  if (!ep.password.empty()) {
    std::vector<std::string_view> auth{"AUTH"};
    if (!ep.user.empty()) auth.push_back(ep.user);
    auth.push_back(ep.password);
    // The reply ("WRONGPASS invalid username-password pair ...") never holds
    // the password, and neither does this message.
    IDEM_ASSIGN_OR_RETURN(ReplyPtr r, conn->Call(auth, "AUTH"));
    if (r->type == REDIS_REPLY_ERROR) {
      std::string as = ep.user.empty() ? "" : " as user '" + ep.user + "'";
      return Status::Unavailable("cannot authenticate to " + where + as + ": " + std::string(r->str, r->len));
    }
  }
  if (ep.db != 0) {
    const std::string db = std::to_string(ep.db);
    std::string_view select[] = {"SELECT", db};
    IDEM_ASSIGN_OR_RETURN(ReplyPtr r, conn->Call(select, "SELECT"));
    if (r->type == REDIS_REPLY_ERROR)
      return Status::InvalidArgument(where + " has no database " + db + ": " + std::string(r->str, r->len));
  }
  if (!o.client_name.empty()) IDEM_RETURN_IF_ERROR(conn->Command({"CLIENT", "SETNAME", o.client_name}).status());
  return conn;
}

Status Conn::Fail(const redisReply* reply, std::string_view what) const {
  return Translate(ctx_.get(), reply, "Redis at " + address_ + ": " + std::string(what));
}

Result<ReplyPtr> Conn::Call(std::span<const std::string_view> args, std::string_view what) {
  if (!healthy()) return Fail(nullptr, what);
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  argv.reserve(args.size());
  lens.reserve(args.size());
  for (std::string_view a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  SigpipeGuard guard;
  ReplyPtr r(
      static_cast<redisReply*>(redisCommandArgv(ctx_.get(), static_cast<int>(argv.size()), argv.data(), lens.data())));
  if (r == nullptr) return Fail(nullptr, what);
  return r;
}

Result<ReplyPtr> Conn::Command(std::span<const std::string_view> args) {
  std::string_view what = args.empty() ? std::string_view("command") : args.front();
  IDEM_ASSIGN_OR_RETURN(ReplyPtr r, Call(args, what));
  if (r->type == REDIS_REPLY_ERROR) return Fail(r.get(), what);
  return r;
}

Result<std::string> Conn::Load(const Script& script) {
  std::string what = std::string("SCRIPT LOAD ") + script.name;
  std::string_view args[] = {"SCRIPT", "LOAD", script.body};
  IDEM_ASSIGN_OR_RETURN(ReplyPtr r, Call(args, what));
  if (r->type != REDIS_REPLY_STRING) return Fail(r.get(), what);
  return std::string(r->str, r->len);
}

Status Conn::Preload(const Script& script) {
  std::string& sha = sha_[&script];
  if (!sha.empty()) return Status::OK();
  IDEM_ASSIGN_OR_RETURN(sha, Load(script));
  return Status::OK();
}

Result<ReplyPtr> Conn::Eval(const Script& script, std::span<const std::string> keys,
                            std::span<const std::string> args) {
  const std::string what = std::string("script ") + script.name;
  for (int attempt = 0;; ++attempt) {
    std::string& sha = sha_[&script];
    if (sha.empty()) {
      IDEM_ASSIGN_OR_RETURN(sha, Load(script));
    }
    const std::string nkeys = std::to_string(keys.size());
    std::vector<std::string_view> argv{"EVALSHA", sha, nkeys};
    argv.insert(argv.end(), keys.begin(), keys.end());
    argv.insert(argv.end(), args.begin(), args.end());
    IDEM_ASSIGN_OR_RETURN(ReplyPtr r, Call(argv, what));
    if (r->type != REDIS_REPLY_ERROR) return r;
    // The server forgot its scripts (restarted, SCRIPT FLUSH): load again once.
    if (attempt == 0 && std::string_view(r->str, r->len).starts_with("NOSCRIPT")) {
      sha.clear();
      continue;
    }
    return Fail(r.get(), what);
  }
}

Status Conn::Append(std::span<const std::string_view> args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (std::string_view a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  if (redisAppendCommandArgv(ctx_.get(), static_cast<int>(argv.size()), argv.data(), lens.data()) != REDIS_OK)
    return Fail(nullptr, args.empty() ? std::string_view("command") : args.front());
  ++pending_;
  return Status::OK();
}

Result<ReplyPtr> Conn::Read(std::string_view what) {
  SigpipeGuard guard;  // the first read writes the queued commands
  IDEM_ASSIGN_OR_RETURN(ReplyPtr r, ReadReply(what));
  if (r->type == REDIS_REPLY_ERROR) return Fail(r.get(), what);
  return r;
}

Result<ReplyPtr> Conn::ReadReply(std::string_view what) {
  if (ctx_->err != 0) return Fail(nullptr, what);
  void* raw = nullptr;
  if (redisGetReply(ctx_.get(), &raw) != REDIS_OK || raw == nullptr) {
    freeReplyObject(raw);
    return Fail(nullptr, what);
  }
  if (pending_ > 0) --pending_;
  return ReplyPtr(static_cast<redisReply*>(raw));
}

Status Conn::Flush(std::string_view what) {
  if (ctx_->err != 0) return Fail(nullptr, what);
  SigpipeGuard guard;
  for (int done = 0; !done;) {
    if (redisBufferWrite(ctx_.get(), &done) != REDIS_OK) return Fail(nullptr, what);
  }
  return Status::OK();
}

const std::string* Conn::LoadedSha(const Script& script) const {
  auto it = sha_.find(&script);
  return it == sha_.end() || it->second.empty() ? nullptr : &it->second;
}

bool Conn::AwaitReply(int64_t max_wait_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, max_wait_ms));
  while (ctx_->err == 0) {
    void* raw = nullptr;
    if (redisGetReplyFromReader(ctx_.get(), &raw) != REDIS_OK) return false;
    if (raw != nullptr) {  // already read with an earlier message
      freeReplyObject(raw);
      return true;
    }
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{ctx_->fd, POLLIN, 0};
    const int n = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 3'600'000)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (redisBufferRead(ctx_.get()) != REDIS_OK) return false;
  }
  return false;
}

// ---- Pool

Result<std::unique_ptr<Conn>> Pool::Open() {
  if (options_.retry_after_ms > 0) {
    std::lock_guard lock(mu_);
    if (!last_failure_.ok() && std::chrono::steady_clock::now() < retry_at_) return last_failure_;
  }
  auto c = Conn::Connect(endpoint_, options_.connect);
  if (!c.ok() && options_.retry_after_ms > 0 && c.status().code() == Code::kUnavailable) {
    std::lock_guard lock(mu_);
    last_failure_ = c.status();
    retry_at_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.retry_after_ms);
  }
  return c;
}

Result<Pool::Lease> Pool::Take() {
  {
    std::lock_guard lock(mu_);
    if (!idle_.empty()) {
      std::unique_ptr<Conn> c = std::move(idle_.back());
      idle_.pop_back();
      return Lease(this, std::move(c));
    }
  }
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<Conn> c, Open());
  return Lease(this, std::move(c));
}

void Pool::Give(std::unique_ptr<Conn> conn) {
  if (!conn->healthy()) return;  // broken: dropped here, a new one is opened on the next Take
  std::lock_guard lock(mu_);
  if (static_cast<int>(idle_.size()) < options_.size) idle_.push_back(std::move(conn));
}

// ---- Pipeline

// One caller's EVALSHA (script set), or its plain commands (script null),
// on its stack while it waits.
struct Pipeline::Request {
  const Script* script = nullptr;
  std::span<const std::string> keys;
  std::span<const std::string> args;
  std::span<const std::vector<std::string_view>> commands;  // script == nullptr
  std::vector<ReplyPtr> replies;                            // of `commands`, when result is OK
  // Written by the leaders; read by the caller once woken.
  std::optional<Result<ReplyPtr>> result;
  bool lead = false;  // woken to read its batch (written already) and lead on
  // 0 waiting, 1 woken, 2 the waker is done with this request (it may go).
  std::atomic<int> state{0};

  void Wake() {
    state.store(1, std::memory_order_release);
    state.notify_one();
    state.store(2, std::memory_order_release);
  }
  void Await() {
    for (;;) {
      const int s = state.load(std::memory_order_acquire);
      if (s == 2) return;
      if (s == 0) {
        state.wait(0, std::memory_order_acquire);
      } else {
        std::this_thread::yield();  // the waker is inside notify_one: a moment
      }
    }
  }
};

// One shared connection and its queue. Only the leader touches `conn` and
// `inflight`.
struct Pipeline::Lane {
  std::mutex mu;
  std::vector<Request*> queue;     // waiting to be written (under mu)
  bool leading = false;            // a leader is writing or reading a batch (under mu)
  std::vector<Request*> inflight;  // written, replies not read yet
  std::unique_ptr<Conn> conn;      // null until opened, or after it broke
};

Pipeline::Pipeline(Endpoint endpoint, ConnectOptions options, std::vector<const Script*> scripts, int connections)
    : endpoint_(std::move(endpoint)), options_(std::move(options)), scripts_(std::move(scripts)) {
  for (int i = 0; i < std::max(1, connections); ++i) lanes_.push_back(std::make_unique<Lane>());
}

Pipeline::~Pipeline() = default;

Result<std::unique_ptr<Conn>> Pipeline::Open() {
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<Conn> c, Conn::Connect(endpoint_, options_));
  for (const Script* s : scripts_) IDEM_RETURN_IF_ERROR(c->Preload(*s));
  return c;
}

Status Pipeline::Connect() {
  Lane& lane = *lanes_.front();
  std::lock_guard lock(lane.mu);
  if (lane.conn != nullptr) return Status::OK();
  // Nobody else uses the pipeline yet: connecting under the lock is fine.
  IDEM_ASSIGN_OR_RETURN(lane.conn, Open());
  return Status::OK();
}

Result<ReplyPtr> Pipeline::Eval(const Script& script, std::span<const std::string> keys,
                                std::span<const std::string> args) {
  Request req{.script = &script, .keys = keys, .args = args};
  Request* reqs[1] = {&req};
  Submit(reqs);
  return std::move(*req.result);
}

std::vector<Result<ReplyPtr>> Pipeline::EvalMany(const Script& script, std::span<const EvalCall> calls) {
  std::vector<Request> reqs(calls.size());
  std::vector<Request*> ptrs;
  ptrs.reserve(calls.size());
  for (size_t i = 0; i < calls.size(); ++i) {
    reqs[i].script = &script;
    reqs[i].keys = calls[i].keys;
    reqs[i].args = calls[i].args;
    ptrs.push_back(&reqs[i]);
  }
  if (!ptrs.empty()) Submit(ptrs);
  std::vector<Result<ReplyPtr>> out;
  out.reserve(calls.size());
  for (Request& r : reqs) out.push_back(std::move(*r.result));
  return out;
}

Result<std::vector<ReplyPtr>> Pipeline::Commands(std::span<const std::vector<std::string_view>> commands) {
  Request req{.commands = commands};
  if (commands.empty()) return std::vector<ReplyPtr>();
  Request* reqs[1] = {&req};
  Submit(reqs);
  if (!req.result->ok()) return req.result->status();
  return std::move(req.replies);
}

// The leader of a lane writes a batch (everything queued), reads its replies
// in order and hands them out; if more calls queued meanwhile, it writes them
// as the next batch at once and passes the reading of it to one of their
// callers, so the server works on it while that thread wakes up. A caller
// with many requests queues them together; they go out in one batch, or in
// consecutive ones, and it may be handed the lead for any of them.
void Pipeline::Submit(std::span<Request* const> reqs) {
  // A thread keeps to one lane: a few threads with many requests each then
  // never queue behind one another (and many threads spread evenly).
  static std::atomic<unsigned> next_thread{0};
  thread_local const unsigned mine = next_thread.fetch_add(1, std::memory_order_relaxed);
  Lane& lane = *lanes_[mine % lanes_.size()];
  std::unique_lock lock(lane.mu);
  lane.queue.insert(lane.queue.end(), reqs.begin(), reqs.end());
  if (!lane.leading) {
    lane.leading = true;
    lane.inflight.swap(lane.queue);
    lock.unlock();
    WriteBatch(lane, lane.inflight);
    Lead(lane);
  } else {
    lock.unlock();
  }
  // Requests in the batch this call led were woken by it (state 2): their
  // Await returns at once.
  for (Request* r : reqs) {
    r->Await();
    if (r->lead) {
      r->lead = false;
      Lead(lane);  // this request's batch is lane.inflight, written already
    }
  }
}

void Pipeline::Lead(Lane& lane) {
  ReadBatch(lane, lane.inflight);
  for (Request* r : lane.inflight) r->Wake();
  lane.inflight.clear();
  std::unique_lock lock(lane.mu);
  if (lane.queue.empty()) {
    lane.leading = false;
    return;
  }
  lane.inflight.swap(lane.queue);
  lock.unlock();
  WriteBatch(lane, lane.inflight);
  Request* next = lane.inflight.front();
  next->lead = true;
  next->Wake();  // after this, `lane.inflight` belongs to `next`
}

// Queues an EVALSHA per request of `batch` and sends them together. A
// request that cannot be sent gets its error here.
void Pipeline::WriteBatch(Lane& lane, std::span<Request* const> batch) {
  auto fail_all = [&](const Status& s) {
    for (Request* r : batch) r->result.emplace(s);
    lane.conn.reset();
  };
  if (lane.conn == nullptr || !lane.conn->healthy()) {
    lane.conn.reset();
    auto c = Open();
    if (!c.ok()) return fail_all(c.status());
    lane.conn = std::move(*c);
  }
  Conn& conn = *lane.conn;
  std::vector<std::string_view> argv;
  for (Request* r : batch) {
    if (r->script == nullptr) {
      for (const auto& cmd : r->commands) {
        if (Status s = conn.Append(cmd); !s.ok()) return fail_all(s);
      }
      continue;
    }
    const std::string* sha = conn.LoadedSha(*r->script);
    // A reload the server refused earlier (NOPERM, BUSY) left no hash: load
    // it again now rather than failing every later call on this connection.
    if (sha == nullptr) {
      if (Status loaded = conn.Preload(*r->script); !loaded.ok()) {
        r->result.emplace(loaded);
        continue;
      }
      sha = conn.LoadedSha(*r->script);
    }
    if (sha == nullptr) {
      r->result.emplace(Status::Internal("script " + std::string(r->script->name) + " is not preloaded"));
      continue;
    }
    const std::string nkeys = std::to_string(r->keys.size());
    argv.assign({std::string_view("EVALSHA"), std::string_view(*sha), std::string_view(nkeys)});
    argv.insert(argv.end(), r->keys.begin(), r->keys.end());
    argv.insert(argv.end(), r->args.begin(), r->args.end());
    // Out of memory: nothing was sent yet; the connection is dropped.
    if (Status s = conn.Append(argv); !s.ok()) return fail_all(s);
  }
  if (Status s = conn.Flush(batch.empty() || batch.front()->script == nullptr ? std::string_view("pipeline")
                                                                              : batch.front()->script->name);
      !s.ok())
    return fail_all(s);
}

// Reads the replies of a written batch in order into each request's
// result. A broken connection fails the rest of the batch and is dropped.
void Pipeline::ReadBatch(Lane& lane, std::span<Request* const> batch) {
  if (lane.conn == nullptr) return;  // WriteBatch failed every request
  Conn& conn = *lane.conn;
  auto what = [](const Request* r) {
    return r->script != nullptr ? std::string("script ") + r->script->name
                                : std::string(r->commands.front().empty() ? "command" : r->commands.front().front());
  };
  std::vector<Request*> noscript;
  bool broken = false;
  for (Request* r : batch) {
    if (r->result.has_value()) continue;
    if (broken) {
      r->result.emplace(conn.Fail(nullptr, what(r)));
      continue;
    }
    if (r->script == nullptr) {  // plain commands: every reply is read, errors too
      Status first_error;
      for (size_t i = 0; i < r->commands.size() && !broken; ++i) {
        auto reply = conn.ReadReply(what(r));
        if (!reply.ok()) {
          broken = true;
          first_error = reply.status();
        } else if ((*reply)->type == REDIS_REPLY_ERROR) {
          if (first_error.ok()) first_error = conn.Fail(reply->get(), what(r));
        } else {
          r->replies.push_back(std::move(*reply));
        }
      }
      if (first_error.ok()) {
        r->result.emplace(ReplyPtr());
      } else {
        r->replies.clear();
        r->result.emplace(first_error);
      }
      continue;
    }
    auto reply = conn.ReadReply(what(r));
    if (!reply.ok()) {
      broken = true;  // every later reply is lost with the connection
      r->result.emplace(reply.status());
      continue;
    }
    const redisReply* rr = reply->get();
    if (rr->type == REDIS_REPLY_ERROR) {
      if (std::string_view(rr->str, rr->len).starts_with("NOSCRIPT")) {
        noscript.push_back(r);
      } else {
        r->result.emplace(conn.Fail(rr, what(r)));
      }
      continue;
    }
    r->result.emplace(std::move(*reply));
  }
  // The server forgot its scripts (restarted, SCRIPT FLUSH): load the script
  // again and run that call on its own (Conn::Eval reloads after NOSCRIPT).
  for (Request* r : noscript) r->result.emplace(conn.Eval(*r->script, r->keys, r->args));
  if (!conn.healthy()) lane.conn.reset();
}

// ---- helpers

std::string LengthPrefixed(std::string_view s) { return std::to_string(s.size()) + ":" + std::string(s); }

std::string GlobEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

std::string_view ReplyString(const redisReply* r) {
  if (r == nullptr || (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_STATUS)) return {};
  return {r->str, r->len};
}

Result<int64_t> ReplyInt(const redisReply* r, std::string_view what) {
  if (r != nullptr && r->type == REDIS_REPLY_INTEGER) return static_cast<int64_t>(r->integer);
  std::string_view s = ReplyString(r);
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size())
    return Status::Internal("unexpected reply to " + std::string(what) + ": not an integer");
  return v;
}

}  // namespace idem::redis_internal
