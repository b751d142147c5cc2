// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "chaos/process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <string_view>

#include <httplib.h>

#include "chaos/config.h"

extern char** environ;

namespace idem::cli::chaos {

std::string SelfExe() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : p.string();
}

Result<pid_t> Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& log) {
  std::vector<std::string> envs;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv(*e);
    if (kv.starts_with("IDEM_KILL_AT=") || kv.starts_with("IDEM_FAULT_VFS=")) continue;
    envs.emplace_back(kv);
  }
  envs.insert(envs.end(), env.begin(), env.end());
  std::vector<char*> av, ev;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  for (const auto& e : envs) ev.push_back(const_cast<char*>(e.c_str()));
  ev.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, av[0], &fa, nullptr, av.data(), ev.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return Status::Unavailable("cannot start " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

Result<int> FreePort() {
  constexpr int kLow = 28'000, kHigh = 32'700;
  std::mt19937 rng(static_cast<unsigned>(::getpid()) * 2654435761u ^ static_cast<unsigned>(SteadyMs()));
  const int start = kLow + static_cast<int>(rng() % (kHigh - kLow));
  for (int i = 0; i < kHigh - kLow; ++i) {
    const int port = kLow + (start - kLow + i) % (kHigh - kLow);
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status::Unavailable("socket: " + std::string(std::strerror(errno)));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (free) return port;
  }
  return Status::Unavailable("no free port on 127.0.0.1 in " + std::to_string(kLow) + "-" + std::to_string(kHigh));
}

bool ProviderHealthy(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(0, 200'000);
  c.set_read_timeout(1, 0);
  auto r = c.Get("/health");
  return r && r->status == 200;
}

}  // namespace idem::cli::chaos
