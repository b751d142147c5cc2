// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem::http::Server: cpp-httplib's server (use it wherever an
// httplib::Server goes: the same routes, options, listen and stop) with a
// leaner way of serving each keep-alive connection.
//
//   idem::http::Server server;                     // instead of httplib::Server
//   server.set_tcp_nodelay(true);
//   server.Post("/charges", idempotency.Wrap("/charges", {}, charge));
//   server.listen("127.0.0.1", 8080);
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
#ifndef IDEM_HTTP_SERVER_H_
#define IDEM_HTTP_SERVER_H_

#include <httplib.h>

namespace idem::http {

class Server : public httplib::Server {
 private:
  // Overrides cpp-httplib's per-connection loop (a virtual of httplib::Server,
  // as its SSLServer does); requests still go through its process_request.
  bool process_and_close_socket(socket_t sock) override;
};

}  // namespace idem::http

#endif  // IDEM_HTTP_SERVER_H_
