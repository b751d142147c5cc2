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
// a response's head goes out with the first piece of its body in one writev;
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
#ifndef IDEM_HTTPLIB_SERVER_H_
#define IDEM_HTTPLIB_SERVER_H_

#include <httplib.h>

#include <memory>

#include "idem/status.h"

namespace idem::httplib {

class Server {
 public:
  Server();
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
  // cpp-httplib's thread pool still takes each connection (one pool thread
  // sleeps per open connection) and bounds how many are served at once.
  // 0 (the default): a thread per connection. kInvalidArgument for a
  // negative count; kUnavailable when the loops cannot be made (epoll).
  Status set_fibers(int threads);

 private:
  class Impl;  // the httplib::Server whose connection loop is idem's
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::httplib

#endif  // IDEM_HTTPLIB_SERVER_H_
