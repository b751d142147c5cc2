// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/testing/throwaway.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <system_error>
#include <thread>
#include <vector>

#include "idem/open.h"
#include "idem/status.h"

namespace idem::testing {

namespace fs = std::filesystem;

TempDir::TempDir(const std::string& prefix) {
  std::string tmpl = (fs::temp_directory_path() / (prefix + "-XXXXXX")).string();
  char* p = ::mkdtemp(tmpl.data());
  if (p == nullptr) {
    std::perror("idem::testing::TempDir: mkdtemp");
    std::abort();
  }
  path_ = p;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

Result<std::unique_ptr<TempSqlite>> TempSqlite::Open(Env* env) {
  std::unique_ptr<TempSqlite> t(new TempSqlite());
  t->dir_ = std::make_unique<TempDir>("idem-sqlite");
  t->url_ = "sqlite:" + t->dir_->File("store.db");
  IDEM_ASSIGN_OR_RETURN(t->store_, OpenStore(t->url_, {.env = env}));
  return t;
}

TempSqlite::~TempSqlite() { store_.reset(); }

namespace {

bool Executable(const fs::path& p) { return ::access(p.c_str(), X_OK) == 0; }

// The directory holding initdb and postgres, or "".
std::string FindBinDir(const std::string& given) {
  if (!given.empty()) return Executable(fs::path(given) / "initdb") ? given : "";
  if (const char* path = std::getenv("PATH")) {
    std::stringstream ss(path);
    for (std::string dir; std::getline(ss, dir, ':');) {
      if (!dir.empty() && Executable(fs::path(dir) / "initdb") && Executable(fs::path(dir) / "postgres")) return dir;
    }
  }
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    if (Executable(e.path() / "bin" / "initdb")) found.push_back((e.path() / "bin").string());
  }
  // Newest first: "15" before "9.6" by version number.
  std::sort(found.begin(), found.end(), [](const std::string& a, const std::string& b) {
    return std::atof(fs::path(a).parent_path().filename().c_str()) >
           std::atof(fs::path(b).parent_path().filename().c_str());
  });
  return found.empty() ? "" : found.front();
}

bool PortFree(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

bool Accepts(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

std::string Slurp(const fs::path& p, size_t max = 4000) {
  std::ifstream in(p);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s.size() > max ? "..." + s.substr(s.size() - max) : s;
}

// Forks and execs argv as `user` (when root), stdout and stderr to `log`.
// Returns the child's PID, or -1.
pid_t Spawn(const std::vector<std::string>& argv, const passwd* user, const std::string& log) {
  pid_t pid = ::fork();
  if (pid != 0) return pid;
  int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ::setsid();  // a Ctrl-C meant for the test is not the server's
  if (user != nullptr && (::setgroups(0, nullptr) != 0 || ::setgid(user->pw_gid) != 0 || ::setuid(user->pw_uid) != 0)) {
    std::perror("idem::testing::TempPostgres: dropping root");
    ::_exit(126);
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  std::perror(argv[0].c_str());
  ::_exit(127);
}

}  // namespace

Result<std::unique_ptr<TempPostgres>> TempPostgres::Start() { return Start(Options{}); }

Result<std::unique_ptr<TempPostgres>> TempPostgres::Start(const Options& options) {
  std::string bin = FindBinDir(options.bin_dir);
  if (bin.empty()) {
    return Status::NotFound("TempPostgres: no PostgreSQL server binaries (initdb, postgres) " +
                            (options.bin_dir.empty() ? std::string("in $PATH or under /usr/lib/postgresql/*/bin")
                                                     : "in " + options.bin_dir) +
                            "; on Debian: apt-get install postgresql");
  }
  const passwd* user = nullptr;
  if (::geteuid() == 0) {
    user = ::getpwnam(options.run_as.c_str());
    if (user == nullptr) {
      return Status::Unavailable("TempPostgres: running as root, and PostgreSQL refuses root; no system user '" +
                                 options.run_as + "' to run it as (set Options::run_as)");
    }
  }
  std::unique_ptr<TempPostgres> pg(new TempPostgres());
  pg->dir_ = std::make_unique<TempDir>("idem-pg");
  const std::string base = pg->dir_->path(), data = base + "/data", log = base + "/server.log";
  ::chmod(base.c_str(), 0755);
  fs::create_directories(data);
  if (user != nullptr && ::chown(data.c_str(), user->pw_uid, user->pw_gid) != 0) {
    return Status::Unavailable("TempPostgres: cannot give " + data + " to " + options.run_as);
  }
  if (user != nullptr && ::chown(base.c_str(), user->pw_uid, user->pw_gid) != 0) {
    return Status::Unavailable("TempPostgres: cannot give " + base + " to " + options.run_as);
  }
  pid_t init =
      Spawn({bin + "/initdb", "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"},
            user, base + "/initdb.log");
  int st = 0;
  if (init < 0 || ::waitpid(init, &st, 0) != init || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    return Status::Unavailable("TempPostgres: initdb failed:\n" + Slurp(base + "/initdb.log"));
  }
  int port = options.port;
  if (port == 0) {
    std::mt19937 rng(static_cast<uint32_t>(::getpid() ^ std::chrono::steady_clock::now().time_since_epoch().count()));
    for (int i = 0; i < 200 && port == 0; ++i) {
      int p = 20000 + static_cast<int>(rng() % 12768);
      if (PortFree(p)) port = p;
    }
    if (port == 0) return Status::Unavailable("TempPostgres: no free port in 20000..32767 on 127.0.0.1");
  }
  {
    std::ofstream conf(data + "/postgresql.conf", std::ios::app);
    conf << "listen_addresses = '127.0.0.1'\nport = " << port << "\nunix_socket_directories = '" << base
         << "'\nfsync = " << (options.fsync ? "on" : "off") << "\nmax_connections = 200\n";
    std::ofstream hba(data + "/pg_hba.conf", std::ios::trunc);
    hba << "local all all trust\nhost all all 127.0.0.1/32 trust\n";
  }
  pg->pid_ = Spawn({bin + "/postgres", "-D", data}, user, log);
  pg->port_ = port;
  if (pg->pid_ < 0) return Status::Unavailable("TempPostgres: fork failed");
  // Ready when it accepts connections and has written its pid file's
  // "ready" line (a connection may be refused while it recovers).
  for (int i = 0; i < 600; ++i) {
    int wst = 0;
    if (::waitpid(pg->pid_, &wst, WNOHANG) == pg->pid_) {
      pg->pid_ = -1;
      return Status::Unavailable("TempPostgres: the server exited at start (port " + std::to_string(port) + "):\n" +
                                 Slurp(log));
    }
    if (Accepts(port) && Slurp(data + "/postmaster.pid").find("ready") != std::string::npos) {
      pg->url_ = "postgres://postgres@127.0.0.1:" + std::to_string(port) + "/postgres";
      return pg;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Status::Unavailable("TempPostgres: the server did not accept connections within 30 s:\n" + Slurp(log));
}

TempPostgres::~TempPostgres() {
  if (pid_ > 0) {
    ::kill(pid_, SIGINT);  // fast shutdown of the server this object started
    int st = 0;
    for (int i = 0; i < 200; ++i) {
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &st, 0);
    }
  }
}

}  // namespace idem::testing
