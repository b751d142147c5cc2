// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Where the tests' throwaway servers listen. Each is started by a script
// (scripts/test-<server>.sh) that is asked for a first port and takes the
// first free one from there on (scripts/test-ports.sh), then writes its URL
// into its state directory (STATE_DIR/url). The servers of the CTest
// fixtures ("pg", "pgbouncer", "redis", "rabbitmq") have theirs in the
// build tree, <build>/<server>-test, which CTest names in IDEM_TEST_SERVERS.
#ifndef IDEM_TEST_UTIL_TEST_SERVERS_H_
#define IDEM_TEST_UTIL_TEST_SERVERS_H_

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>

#include "util/temp_dir.h"

namespace idem::testing {

// The URL a start script wrote into `state_dir` ("" if there is none).
inline std::string StartedServerUrl(const std::string& state_dir) {
  std::string url;
  std::ifstream in(state_dir + "/url");
  std::getline(in, url);
  return url;
}

// The URL of the fixture's server `server` ("pg", "pgbouncer", "redis",
// "rabbitmq"). A missing server is a failure, never a skip; `fallback` is
// returned then (an address where nothing answers).
inline std::string FixtureServerUrl(const std::string& server, const std::string& fallback) {
  const char* dir = std::getenv("IDEM_TEST_SERVERS");
  if (dir == nullptr || *dir == '\0') {
    ADD_FAILURE() << "IDEM_TEST_SERVERS is not set: run the tests with ctest (its fixtures start the servers) or "
                     "./run test";
    return fallback;
  }
  std::string url = StartedServerUrl(std::string(dir) + "/" + server + "-test");
  if (url.empty()) {
    ADD_FAILURE() << "no " << server << " server was started in " << dir << "/" << server
                  << "-test: run the tests with ctest (its fixture starts it) or ./run test";
    return fallback;
  }
  return url;
}

// The port of "scheme://[user@]host:PORT[/...]" (0 if it has none).
inline int UrlPort(const std::string& url) {
  const size_t host = url.find("://");
  const size_t at = url.find('@', host == std::string::npos ? 0 : host + 3);
  const size_t from = at != std::string::npos ? at + 1 : (host == std::string::npos ? 0 : host + 3);
  const size_t colon = url.find(':', from);
  return colon == std::string::npos ? 0 : std::atoi(url.c_str() + colon + 1);
}

// The first port from `first` on that a listener can bind on 127.0.0.1
// (for a server a test starts itself): the configured port when it is free.
inline int FirstFreePort(int first) {
  for (int port = first; port < first + 200 && port < 65536; ++port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return first;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 1) == 0;
    ::close(fd);
    if (free) return port;
  }
  return first;
}

// A TCP socket listening on 127.0.0.1 at a free port (written to `port`),
// for a server a test writes itself; -1 when it cannot be made.
inline int ListenOnLoopback(int backlog, int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, backlog) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  port = ntohs(a.sin_port);
  return fd;
}

// A name on a shared server (a queue, a stream, a key prefix) that no other
// test and no other run uses: `prefix`, the running test's name, the process
// id, the time and a random number ([A-Za-z0-9_-] only). Each call gives
// another.
inline std::string UniqueServerName(const std::string& prefix) {
  static std::atomic<int> counter{0};
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test = info == nullptr ? "none" : std::string(info->test_suite_name()) + "." + info->name();
  for (char& c : test)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') c = '_';
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return prefix + test.substr(0, 120) + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
         std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now).count()) + "-" +
         std::to_string(std::random_device{}());
}

// The name of `dir`'s channel on a shared server: a UniqueServerName made at
// the first call and kept in a file in the directory, so that later calls
// with the same dir (in this process or a forked child) get the same name,
// and no other dir does.
inline std::string ServerNameFor(const TempDir& dir, const std::string& prefix) {
  const std::string file = dir.File("server-name");
  std::string name;
  if (std::ifstream in(file); in && std::getline(in, name) && !name.empty()) return name;
  name = UniqueServerName(prefix);
  std::ofstream(file) << name << "\n";
  return name;
}

}  // namespace idem::testing

#endif  // IDEM_TEST_UTIL_TEST_SERVERS_H_
