// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The Redis test server (started by the CTest fixture "redis", see
// scripts/test-redis.sh), key prefixes that keep tests apart, and a raw
// command helper for what the tests do behind idem's back.
#ifndef IDEM_TEST_REDIS_REDIS_TEST_UTIL_H_
#define IDEM_TEST_REDIS_REDIS_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "redis/client.h"
#include "util/test_util.h"

namespace idem::testing {

// The server's URL. A missing server is a failure, never a skip.
inline std::string RedisUrl() {
  const char* url = std::getenv("IDEM_TEST_REDIS_URL");
  if (url == nullptr || *url == '\0') {
    ADD_FAILURE() << "IDEM_TEST_REDIS_URL is not set: run the tests with ctest (its fixture starts redis-server) "
                     "or ./run test";
    return "redis://127.0.0.1:1";
  }
  return url;
}

// "host:port" of the test server.
inline std::string RedisAddress() {
  auto ep = redis_internal::ParseUrl(RedisUrl());
  return ep.ok() ? ep->Address() : "?";
}

// A key prefix no other test (or earlier run) has used.
inline std::string UniquePrefix() {
  static std::atomic<int> counter{0};
  std::random_device rd;
  return "idem-test:" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
         std::to_string(::time(nullptr)) + "-" + std::to_string(rd()) + ":";
}

// The prefix of `dir`'s store: made unique at the first open and kept in a
// file in the directory, so that later opens of the same dir (in this process
// or a forked one) see the same keys and no other dir does.
inline std::string PrefixFor(const TempDir& dir) {
  const std::string file = dir.File("redis-prefix");
  std::string prefix;
  if (std::ifstream in(file); in && std::getline(in, prefix) && !prefix.empty()) return prefix;
  prefix = UniquePrefix();
  std::ofstream(file) << prefix << "\n";
  return prefix;
}

// Runs one command on the test server (or `url`) on a fresh connection.
// Returns the reply as text: a string/status as is, an integer in decimal,
// an array's elements joined by '\n', an error as "ERROR: ...".
inline std::string RedisRaw(const std::vector<std::string>& args, const std::string& url = RedisUrl()) {
  auto ep = redis_internal::ParseUrl(url);
  if (!ep.ok()) return "ERROR: " + ep.status().ToString();
  auto c = redis_internal::Conn::Connect(*ep, {});
  if (!c.ok()) return "ERROR: " + c.status().ToString();
  std::vector<std::string_view> argv(args.begin(), args.end());
  auto r = (*c)->Command(argv);
  if (!r.ok()) return "ERROR: " + r.status().ToString();
  const redisReply* reply = r->get();
  if (reply->type == REDIS_REPLY_INTEGER) return std::to_string(reply->integer);
  if (reply->type == REDIS_REPLY_ARRAY) {
    std::string out;
    for (size_t i = 0; i < reply->elements; ++i) {
      if (i) out += '\n';
      out += std::string(redis_internal::ReplyString(reply->element[i]));
    }
    return out;
  }
  return std::string(redis_internal::ReplyString(reply));
}

// Closes every connection of the server whose client name is `name`
// (CLIENT LIST, then CLIENT KILL ID). Returns how many.
inline int KillClientsNamed(const std::string& name) {
  std::string list = RedisRaw({"CLIENT", "LIST"});
  int killed = 0;
  size_t pos = 0;
  while (pos < list.size()) {
    size_t end = list.find('\n', pos);
    std::string line = list.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    pos = end == std::string::npos ? list.size() : end + 1;
    if (line.find(" name=" + name + " ") == std::string::npos) continue;
    std::string id = line.substr(3, line.find(' ') - 3);  // "id=N ..."
    if (RedisRaw({"CLIENT", "KILL", "ID", id}) == "1") ++killed;
  }
  return killed;
}

}  // namespace idem::testing

#endif  // IDEM_TEST_REDIS_REDIS_TEST_UTIL_H_
