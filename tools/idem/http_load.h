// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The HTTP benchmarks' load (`idem bench webhooks`, `idem bench pooler`,
// `idem bench gateway`): requests posted once each, from a number of
// keep-alive connections at once, to a server on 127.0.0.1, as wrk sends
// them: every connection on one thread's epoll loop, so that the load takes
// as little as it can of the cores the server under test runs on.
#ifndef IDEM_TOOLS_IDEM_HTTP_LOAD_H_
#define IDEM_TOOLS_IDEM_HTTP_LOAD_H_

#include <httplib.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace idem::cli {

struct HttpPost {
  std::string body;
  ::httplib::Headers headers;
};

struct PostedAll {
  double seconds = 0;      // from the first request to the last answer
  int64_t unexpected = 0;  // answers whose status was not the one expected (or none)
  // The CPU spent meanwhile: by this process (its servers and the senders),
  // and by the whole machine (other processes too, e.g. a database server),
  // in seconds; the machine's is 0 where /proc/stat cannot be read.
  double process_cpu_seconds = 0;
  double machine_cpu_seconds = 0;
  int64_t context_switches = 0;  // this process's threads', voluntary or not
  // Each answered request's time from its first send to its answer, under
  // this load, sorted (by Little's law, rate = senders / mean).
  std::vector<double> latencies_ms;
};

// Posts every request of `posts` (content type application/json) to `path`
// on 127.0.0.1:`port` from `senders` keep-alive connections, each sending its
// next request when the last one is answered, taking the next request in
// turn. Every connection connects first (and is answered once), so the time
// is the requests' and not the connections'. A request whose connection the
// server closed before answering is sent again on a new one (at most twice),
// as a client would. The first answer that is not `expected_status` goes to
// stderr, after "idem <who>: ".
PostedAll PostAll(int port, const std::string& path, const std::vector<HttpPost>& posts, int senders,
                  int expected_status, const std::string& who);

// HTTP/1.1 framing for the loops of the benchmarks (the load above and
// `idem bench gateway`'s upstream): a message whose head ends in `buf`.
struct HttpHead {
  size_t head_size = 0;        // up to and including the blank line
  int64_t content_length = 0;  // 0 when absent
  bool chunked = false;        // Transfer-Encoding: chunked (not read by these loops)
  bool close = false;          // Connection: close
  std::string_view start_line;
  std::string_view headers;  // the header lines, each ending in CRLF
};

// The head at the start of `buf`, or nothing while it is incomplete.
std::optional<HttpHead> ParseHttpHead(std::string_view buf);

// The value of header `name` (case-insensitive) in `head`, or empty.
std::string_view HttpHeaderValue(const HttpHead& head, std::string_view name);

// Non-blocking sockets of these loops. ReadAvailable appends what `fd` has
// to `in` until it would block; false once the peer closed or an error
// came. WritePending sends `out` from `sent` on until done or it would
// block; false on an error.
bool ReadAvailable(int fd, std::string& in);
bool WritePending(int fd, const std::string& out, size_t& sent);

}  // namespace idem::cli

#endif  // IDEM_TOOLS_IDEM_HTTP_LOAD_H_
