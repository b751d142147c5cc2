// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The HTTP benchmarks' load (`idem bench webhooks`, `idem bench pooler`):
// requests posted once each, from a number of keep-alive connections at
// once, to a server in this process on 127.0.0.1, as wrk would send them.
#ifndef IDEM_TOOLS_IDEM_HTTP_LOAD_H_
#define IDEM_TOOLS_IDEM_HTTP_LOAD_H_

#include <httplib.h>

#include <cstdint>
#include <string>
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
};

// Posts every request of `posts` (content type application/json) to `path`
// on 127.0.0.1:`port` from `senders` threads, each with a connection of its
// own, taking the next request in turn. Every sender connects first, so
// the time is the requests' and not the connections'. A connection the
// server closed under a request is retried (at most twice), as a client
// would. The first answer that is not `expected_status` goes to stderr,
// after "idem <who>: ".
PostedAll PostAll(int port, const std::string& path, const std::vector<HttpPost>& posts, int senders,
                  int expected_status, const std::string& who);

}  // namespace idem::cli

#endif  // IDEM_TOOLS_IDEM_HTTP_LOAD_H_
