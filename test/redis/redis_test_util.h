// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The Redis test server (started by the CTest fixture "redis", see
// scripts/test-redis.sh), key prefixes that keep tests apart, a raw
// command helper for what the tests do behind idem's back, and servers of a
// test's own (OwnRedis) for restarts.
#ifndef IDEM_TEST_REDIS_REDIS_TEST_UTIL_H_
#define IDEM_TEST_REDIS_REDIS_TEST_UTIL_H_

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "redis/client.h"
#include "util/test_servers.h"
#include "util/test_util.h"

namespace idem::testing {

// The server's URL (util/test_servers.h). A missing server is a failure,
// never a skip.
inline std::string RedisUrl() { return FixtureServerUrl("redis", "redis://127.0.0.1:1"); }

// "host:port" of the test server.
inline std::string RedisAddress() {
  auto ep = redis_internal::ParseUrl(RedisUrl());
  return ep.ok() ? ep->Address() : "?";
}

// A key prefix no other test (or earlier run) has used (util/test_servers.h).
inline std::string UniquePrefix() { return UniqueServerName("idem-test:") + ":"; }

// The prefix of `dir`'s store: made unique at the first open and kept in a
// file in the directory, so that later opens of the same dir (in this process
// or a forked one) see the same keys and no other dir does.
inline std::string PrefixFor(const TempDir& dir) { return ServerNameFor(dir, "idem-test:") + ":"; }

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

// A port on 127.0.0.1 that nothing listens on now: one the kernel picked
// for a socket bound to port 0, and that answers no PING. 0 if none.
inline int FreeLocalPort() {
  for (int attempt = 0; attempt < 20; ++attempt) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    socklen_t len = sizeof a;
    int port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
      port = ntohs(a.sin_port);
    ::close(fd);
    if (port != 0 && RedisRaw({"PING"}, "redis://127.0.0.1:" + std::to_string(port)).starts_with("ERROR")) return port;
  }
  return 0;
}

// A redis-server of a test's own on 127.0.0.1:port (Debian's redis-server on
// the PATH), in a session of its own, stopped by its PID.
class OwnRedis {
 public:
  // On the first free port from `port` on.
  explicit OwnRedis(int port) : port_(FirstFreePort(port)) {}
  ~OwnRedis() { Stop(); }
  OwnRedis(const OwnRedis&) = delete;
  OwnRedis& operator=(const OwnRedis&) = delete;
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return pid_; }

  // Starts the server with its data in dir and waits until it answers.
  // persistent: AOF with fsync always (a restart keeps every write); else
  // no AOF and no snapshots (a restart starts empty).
  bool Start(const std::string& dir, bool persistent = true) {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::setsid();
      const std::string port = std::to_string(port_), log = dir + "/redis.log";
      const char* aof = persistent ? "yes" : "no";
      ::execlp("redis-server", "redis-server", "--bind", "127.0.0.1", "--port", port.c_str(), "--save", "",
               "--appendonly", aof, "--appendfsync", "always", "--daemonize", "no", "--dir", dir.c_str(), "--logfile",
               log.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    if (pid_ < 0) return false;
    for (int i = 0; i < 100; ++i) {
      if (RedisRaw({"PING"}, url()) == "PONG") return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  // SIGTERM (the server writes its AOF, if any, and exits), by PID.
  void Stop() { Signal(SIGTERM); }
  // SIGKILL, by PID: the server writes nothing more.
  void Kill() { Signal(SIGKILL); }

 private:
  void Signal(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
  }

  int port_;
  pid_t pid_ = -1;
};

}  // namespace idem::testing

#endif  // IDEM_TEST_REDIS_REDIS_TEST_UTIL_H_
