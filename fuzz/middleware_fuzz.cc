// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The Idempotency-Key middleware end to end, in process: the neutral core
// (http::Idempotency) on a SQLite store in a temporary directory, serving an
// http::Request built from the fuzz bytes (route, method, path, headers,
// body, what the handler answers; see LLVMFuzzerTestOneInput) on a two-phase route, a transactional
// route, a validating route and a group-commit route; each request is
// served twice. Any bytes in, an answer out: no crash, no hang, and the
// store is started afresh every kRequestsPerStore inputs so it cannot grow
// without bound (libFuzzer's -rss_limit_mb catches a leak).
// Properties: every answer has a status 100..599 and header values without
// CR, LF or NUL; every log line is printable ASCII; a response the route
// stored is replayed byte-identical to the same request.
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "idem/claims.h"
#include "idem/http/idempotency.h"
#include "idem/message.h"
#include "idem/sqlite/store.h"
#include "util/temp_dir.h"

namespace {

using idem::http::Answer;
using idem::http::Request;

constexpr int kRequestsPerStore = 256;

// The input's next line (without its '\n').
std::string_view Line(std::string_view& in) {
  const size_t nl = in.find('\n');
  std::string_view line = in.substr(0, nl);
  in = nl == std::string_view::npos ? std::string_view() : in.substr(nl + 1);
  return line;
}

// The status a handler is told to answer: STATUS when it is 100..599.
int ToStatus(std::string_view s) {
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && p == s.data() + s.size() && v >= 100 && v <= 599 ? v : 201;
}

// The first word of `s` (up to a space); `s` keeps what follows the space.
std::string_view Word(std::string_view& s) {
  const size_t sp = s.find(' ');
  std::string_view word = s.substr(0, sp);
  s = sp == std::string_view::npos ? std::string_view() : s.substr(sp + 1);
  return word;
}

void CheckLine(const std::string& line) {
  for (unsigned char c : line) {
    if (c < 0x20 || c > 0x7e) {
      std::fprintf(stderr, "log line with byte 0x%02x: %s\n", c, idem::Printable(line, line.size()).c_str());
      __builtin_trap();
    }
  }
}

// What the handler is told to answer, from the fuzz bytes.
struct Script {
  int status = 201;
  bool throws = false;
  int executions = 0;
};

class World {
 public:
  World() {
    auto s = idem::sqlite::Store::Open({.path = dir_.File("idem.db"), .synchronous = idem::sqlite::Synchronous::kOff});
    if (!s.ok()) std::abort();
    store_ = std::move(*s);
    auto tx = store_->Begin();
    if (!tx.ok() || !(*tx)->Exec("CREATE TABLE effects(k TEXT NOT NULL)", {}).ok() || !(*tx)->Commit().ok())
      std::abort();
    claims_ = std::make_unique<idem::Claims>(*store_->claim_store());
    plain_ = Open(0);
    grouped_ = Open(4);
    auto handler = [this](const Request& req, Answer& ans) { Run(req, ans); };
    auto tx_handler = [this](const Request& req, Answer& ans, idem::Transaction& tx) {
      if (!tx.Exec("INSERT INTO effects(k) VALUES ($1)", {idem::Value(req.body.substr(0, 64))}).ok())
        throw std::runtime_error("insert failed");
      Run(req, ans);
    };
    idem::http::RoutePolicy validating;
    validating.require_key = false;
    validating.stored_4xx = {402};
    validating.store_5xx = true;
    validating.validate = [](const Request& req, Answer& ans) {
      if (req.body.size() % 3 != 0) return true;
      ans.status = 422;
      return false;
    };
    routes_.push_back(Must(plain_->Wrap("/charges", {}, handler)));
    routes_.push_back(Must(plain_->WrapInTransaction("/tx", {}, *store_, tx_handler)));
    routes_.push_back(Must(plain_->Wrap("/validated", validating, handler)));
    routes_.push_back(Must(grouped_->WrapInTransaction("/grouped", {}, *store_, tx_handler)));
  }

  // Serves `req` on route `route` twice; checks both answers.
  void Serve(size_t route, const Request& req, const Script& script) {
    script_ = script;
    Answer first, second;
    routes_[route % routes_.size()](req, first);
    const int ran = script_.executions;
    routes_[route % routes_.size()](req, second);
    Check(first);
    Check(second);
    // Stored (a 2xx of a guarded request that ran): the repeat is a replay.
    if (ran == 1 && script_.executions == 1 && first.status >= 200 && first.status < 300 &&
        (second.status != first.status || second.body != first.body))
      __builtin_trap();
  }

 private:
  std::unique_ptr<idem::http::Idempotency> Open(int group_commit_max) {
    auto m =
        idem::http::Idempotency::Open({.claims = claims_.get(),
                                       .authenticate = idem::http::BearerKeys({{"sk_a", "acct_a"}, {"sk_b", "acct_b"}}),
                                       .max_body_bytes = 4096,
                                       .max_keys_per_principal = 200,
                                       .group_commit_max = group_commit_max,
                                       .log = CheckLine});
    if (!m.ok()) std::abort();
    return std::move(*m);
  }

  static idem::http::Handler Must(idem::Result<idem::http::Handler> h) {
    if (!h.ok()) std::abort();
    return std::move(*h);
  }

  void Run(const Request& req, Answer& ans) {
    ++script_.executions;
    if (script_.throws) throw std::runtime_error("handler threw");
    ans.status = script_.status;
    ans.headers.Add("Location", "/charges/ch_1");
    ans.SetBody(R"({"id":"ch_1","bytes":)" + std::to_string(req.body.size()) + "}", "application/json");
  }

  static void Check(const Answer& a) {
    if (a.status < 100 || a.status > 599) __builtin_trap();
    for (const auto& [name, value] : a.headers)
      if (name.find_first_of(std::string("\r\n\0", 3)) != std::string::npos ||
          value.find_first_of(std::string("\r\n\0", 3)) != std::string::npos)
        __builtin_trap();
  }

  idem::testing::TempDir dir_;
  std::unique_ptr<idem::Store> store_;
  std::unique_ptr<idem::Claims> claims_;
  std::unique_ptr<idem::http::Idempotency> plain_, grouped_;
  std::vector<idem::http::Handler> routes_;
  Script script_;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static std::unique_ptr<World> world;
  static int served = 0;
  if (!world || ++served % kRequestsPerStore == 0) {
    world.reset();
    world = std::make_unique<World>();
  }
  std::string_view in(reinterpret_cast<const char*>(data), size);
  // ROUTE STATUS METHOD PATH: ROUTE's first byte picks the route; STATUS is
  // what the handler answers (100..599, else 201), or "throw".
  std::string_view head = Line(in);
  const std::string_view route_word = Word(head);
  const size_t route = route_word.empty() ? 0 : static_cast<unsigned char>(route_word[0]) % 4;
  const std::string_view status = Word(head);
  Script script;
  script.throws = status == "throw";
  script.status = ToStatus(status);
  Request req;
  req.method = std::string(Word(head));
  req.path = std::string(head);
  // NAME: VALUE lines up to an empty line, then the body.
  while (!in.empty()) {
    const std::string_view line = Line(in);
    if (line.empty() || line == "\r") break;
    const size_t colon = line.find(':');
    std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
    if (value.starts_with(' ')) value.remove_prefix(1);
    req.headers.Add(std::string(line.substr(0, colon)), std::string(value));
  }
  req.body = std::string(in);
  world->Serve(route, req, script);
  return 0;
}
