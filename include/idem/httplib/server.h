// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::httplib::Server: a cpp-httplib server (native() is the
// httplib::Server: its routes, options, bind, listen and stop) with a leaner
// way of serving each keep-alive connection, and optionally fibers.
//
//   idem::httplib::Server server;                  // instead of httplib::Server
//   server.native().set_tcp_nodelay(true);
//   server.native().Post("/charges", *idem::httplib::Wrap(*idempotency, "/charges", {}, charge));
//   server.native().listen("127.0.0.1", 8080);
//
// cpp-httplib 0.11 (Debian 12's) polls before every read and every write of a
// connection, sends a response's headers and body in two writes (two TCP
// segments with TCP_NODELAY), makes a new stream for every request of a
// keep-alive connection (so the bytes of a pipelined request read with the one
// before it are lost), and waits for a keep-alive connection's next request
// in 10 ms polls with 1 ms naps between them, without watching for stop().
// This server keeps one stream for the life of the connection and per request
// makes one poll (while the connection waits for it), one recv and one send:
// a response's head goes out with the first piece of its body in one writev
// (a response whose body cannot be written at all -- a content provider that
// returns false at once -- is not sent: the connection closes without an
// answer, as a response lost on the way);
// the later pieces of a streamed body go out as they are written; a reply the
// client waits for before it sends more (`100 Continue`) goes out before the
// next read. It follows each request through the bytes cpp-httplib reads and
// closes the connection after a response to a request whose head or body was
// not read to its end (a request line it cannot parse, a body too long, a
// handler that left its body unread), so those bytes are never taken for a
// request of their own. Idle connections see stop() within 100 ms. Requests
// are parsed, routed and answered by cpp-httplib itself, unchanged (its
// logger and content-provider callbacks run before the last send, as
// cpp-httplib's own loop does for a response's final bytes).
//
// Hostile clients: no connection holds a thread while it waits for bytes. A
// connection is accepted (or refused, over Options' bounds) on the accept
// thread; it then waits as a fiber parked in an epoll set until a request's
// whole head (and a body of up to 256 KiB) has arrived, and only then is the
// request handed to a thread (Options::threads) -- or, with Options::fibers,
// run on the fiber itself. A request whose head and body do not arrive within
// Options::request_deadline_ms of its first byte is closed unanswered (no
// handler saw it). Replacing native().new_task_queue brings back cpp-httplib's
// way: a thread of that queue for each connection's whole life.
//
// Behind load balancers (Options::trusted_proxies): every client of a
// balancer shares its address, so the per-client bound
// (max_connections_per_client) counts the client the balancer names
// instead, and a connection from a trusted proxy's address is never counted
// for that address. The rule:
//   - With Options::proxy_protocol, a connection from a trusted proxy must
//     start with a PROXY protocol header (v1 text or v2 binary), read within
//     request_deadline_ms of its accept. The client it names is the
//     connection's for its whole life: counted under the bound (over it:
//     503, closed) and seen by handlers as the request's remote address. A
//     header that names no client (v1 UNKNOWN, v2 LOCAL) or names a trusted
//     proxy leaves the connection to the next rule.
//   - Otherwise each request of a trusted proxy's connection is counted for
//     the client its X-Forwarded-For names: the rightmost address that is
//     not a trusted proxy's (the leftmost when all are). It counts from the
//     end of its head to the end of its answer, so a client's slow requests
//     (a body that trickles in, a handler still running) are held to the
//     bound together wherever they came through; a request over it is
//     answered 503 with Retry-After: 1 and its connection closed. Without a
//     usable X-Forwarded-For (none, or an entry on that walk that is not an
//     address: Counters::forwarded_for_malformed, Options::log) it counts
//     for the proxy's own address. Between requests, and while a head
//     arrives, such a connection counts toward max_connections only (a head
//     still has request_deadline_ms).
//   - With proxy_protocol, a connection that starts with a PROXY header
//     from an address that is not trusted, or a trusted proxy's with a
//     malformed header or none, is closed unanswered
//     (Counters::proxy_refused, Options::log). An untrusted peer's
//     X-Forwarded-For is ignored: it counts for its own address, whatever
//     it says.
//
// Thread safety: configure (native(), set_fibers) before listen; Stop() and counters()
// from any thread.
#ifndef IDEM_HTTPLIB_SERVER_H_
#define IDEM_HTTPLIB_SERVER_H_

#include <httplib.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "idem/result.h"
#include "idem/signals.h"
#include "idem/status.h"

namespace idem::httplib {

class Server {
 public:
  struct Options {
    // How long a request's head and body may take to arrive in all, from its
    // first byte (not per read): a connection that misses it is closed
    // without an answer, and nothing of the request reaches a handler. >= 1.
    // Default: 10'000.
    int64_t request_deadline_ms = 10'000;
    // Open connections at most. A connection over a bound is answered
    // `503 Service Unavailable` with `Retry-After: 1` (sent without waiting,
    // best effort: a client still sending may see a reset instead) and
    // closed at once. Keep it under the process's file descriptor limit.
    // >= 1. Default: 1024.
    int max_connections = 1024;
    // Open connections at most from one client address (0: no such bound,
    // for a server behind a proxy, where every client has the proxy's
    // address). >= 0. Default: 256.
    int max_connections_per_client = 256;
    // Threads that run requests (their handlers) when the connections are
    // not fibers: how many requests are served at once. A connection
    // waiting for its next request or for the rest of one holds none.
    // 1..4096. Default: 8.
    int threads = 8;
    // Requests served on one keep-alive connection before the server closes
    // it (the last response says `Connection: close`; the client opens a
    // new one). cpp-httplib's own default is 5, which makes a client (or a
    // proxy's connection pool) reconnect every fifth request. >= 1.
    // Default: 1000 (nginx's keepalive_requests).
    int keep_alive_requests = 1000;
    // Connections (and their requests) as fibers on this many threads
    // instead (see set_fibers); 0: requests run on `threads`. 0..1024.
    // Default: 0.
    int fibers = 0;
    // Load balancers and proxies whose word about the client is taken (the
    // rule above): IPv4 or IPv6 addresses and CIDR blocks ("10.0.0.0/8",
    // "fd00::/8", "192.0.2.7"). Empty: none (every peer is the client).
    std::vector<std::string> trusted_proxies{};
    // Connections from trusted_proxies start with a PROXY protocol header
    // (v1 or v2, as HAProxy's send-proxy / send-proxy-v2 and the cloud load
    // balancers send it). Needs trusted_proxies. Default: false.
    bool proxy_protocol = false;
    // Optional: a line for each connection or request the rule above
    // refused or could not attribute (a PROXY header refused, a malformed
    // X-Forwarded-For), naming the peer and why; client text quoted and
    // escaped. Called on the server's threads.
    std::function<void(const std::string& line)> log{};
  };

  // What the server did with connections since it was made.
  struct Counters {
    int64_t accepted = 0;         // connections admitted
    int64_t refused = 0;          // connections (or a trusted proxy's requests) answered 503 over a bound
    int64_t deadline_closes = 0;  // connections closed for a request past request_deadline_ms
    int64_t open = 0;             // connections open now
    // Connections closed unanswered for their PROXY header: from an address
    // not trusted, or malformed or missing from a trusted proxy.
    int64_t proxy_refused = 0;
    // Requests from a trusted proxy whose X-Forwarded-For named no usable
    // client (counted for the proxy's own address).
    int64_t forwarded_for_malformed = 0;
  };

  // Checks every field (kInvalidArgument naming it), then makes the server
  // (kUnavailable when its loops cannot be made: epoll, threads).
  static Result<std::unique_ptr<Server>> Open(const Options& options);
  // The checks of Open alone (kInvalidArgument naming the field, and the
  // entry of trusted_proxies that is no address or CIDR block).
  static Status Check(const Options& options);

  // A server with the default Options.
  Server();
  // Detaches StopOnSignals if it names this server.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The cpp-httplib server to configure, route and run. Valid for the
  // Server's life.
  ::httplib::Server& native();

  // Serves the connections as fibers on `threads` threads (call before
  // listen): a connection gives its thread up where a thread of its own
  // would sleep (waiting for bytes, or for its group of requests to commit
  // under Idempotency::Options::group_commit_max), so a few threads serve
  // every connection without a thread switch per request. For routes whose
  // handlers do not block: a handler that waits (a network round trip, a
  // lock held elsewhere, a sleep) holds up every connection of its thread.
  // 0: requests on Options::threads. As Options::fibers; kInvalidArgument for
  // a count out of range; kUnavailable when the loops cannot be made (epoll).
  Status set_fibers(int threads);

  Counters counters() const;

  // Stops serving, as native().stop() does, but async-signal-safe and
  // harmless when called again: listen() returns once every connection has
  // ended (a request being handled is answered first; an idle keep-alive
  // connection closes within 100 ms). Before listen(), a later listen()
  // returns at once. Any thread.
  void Stop() noexcept;

 private:
  class Impl;  // the httplib::Server whose connection loop is idem's
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::httplib

namespace idem {
// Makes SIGINT and SIGTERM call server->Stop(): listen() returns once the
// connections have ended (idem/signals.h: other objects attached stop too;
// the handlers before the first attach come back when the last one is
// detached). Pass nullptr to detach every object; the server's destructor
// detaches it.
void StopOnSignals(httplib::Server* server);
}  // namespace idem

#endif  // IDEM_HTTPLIB_SERVER_H_
