// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "cli.h"

#include "core/json_string.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string_view>

#include "components.h"
#include "idem/open.h"
#include "idem/sqlite/store.h"
#include "idem/url.h"

namespace idem::cli {

// "90s", "15m", "24h", "7d", or plain milliseconds.
Result<int64_t> ParseDurationMs(const std::string& s) {
  if (s.empty()) return Status::InvalidArgument("duration is empty");
  char* end = nullptr;
  double n = std::strtod(s.c_str(), &end);
  std::string unit(end);
  int64_t mul = 0;
  if (unit == "ms" || unit.empty())
    mul = 1;
  else if (unit == "s")
    mul = 1000;
  else if (unit == "m")
    mul = 60'000;
  else if (unit == "h")
    mul = 3'600'000;
  else if (unit == "d")
    mul = 86'400'000;
  constexpr double kMaxMs = 100.0 * 365 * 86'400'000;  // a century
  if (mul == 0 || end == s.c_str() || !std::isfinite(n) || n < 0)
    return Status::InvalidArgument("'" + s + "' is not a duration (use e.g. 90s, 15m, 24h, 7d)");
  if (n * static_cast<double>(mul) > kMaxMs)
    return Status::InvalidArgument("duration '" + s + "' is longer than a century");
  return static_cast<int64_t>(n * static_cast<double>(mul));
}

int PeerResult(const std::string& peer, std::string_view store, int64_t unique, int64_t deliveries, double seconds,
               int64_t effects, bool ok) {
  std::printf("peer=%s store=%.*s unique=%lld deliveries=%lld seconds=%.3f deliveries_per_s=%.1f effects=%lld\n",
              peer.c_str(), static_cast<int>(store.size()), store.data(), static_cast<long long>(unique),
              static_cast<long long>(deliveries), seconds, static_cast<double>(deliveries) / seconds,
              static_cast<long long>(effects));
  std::fflush(stdout);
  if (ok) return kExitOk;
  std::fprintf(stderr, "CORRECTNESS CHECK FAILED\n");
  return kExitCheckFailed;
}

Result<Args> Args::Parse(const Command& cmd, int argc, char** argv) {
  Args a;
  a.cmd_ = &cmd;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      a.help_ = true;
      continue;
    }
    if (arg.size() > 1 && arg[0] == '-' && arg[1] != '-')
      return Status::InvalidArgument("unknown flag " + arg + " (flags are --name; see idem " + cmd.name + " --help)");
    if (arg.rfind("--", 0) != 0 || arg == "--") {
      if (static_cast<int>(a.positional_.size()) >= cmd.max_positional)
        return Status::InvalidArgument("unexpected argument '" + arg + "' (see idem " + cmd.name + " --help)");
      a.positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    const FlagSpec* spec = nullptr;
    for (const auto& f : cmd.flags)
      if (f.name == name) spec = &f;
    if (spec == nullptr)
      return Status::InvalidArgument("unknown flag --" + name + " (see idem " + cmd.name + " --help)");
    if (!spec->repeatable && a.values_.count(name) > 0)
      return Status::InvalidArgument("flag --" + name + " given twice");
    if (spec->value.empty()) {
      if (has_value) return Status::InvalidArgument("flag --" + name + " takes no value");
      a.values_[name] = "true";
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc || std::string_view(argv[i + 1]).rfind("--", 0) == 0)
        return Status::InvalidArgument("flag --" + name + " needs a value (" + spec->value + ")" +
                                       (i + 1 < argc ? ", not the flag " + std::string(argv[i + 1]) : ""));
      value = argv[++i];
    }
    a.values_[name] = value;
    a.all_[name].push_back(value);
  }
  return a;
}

std::string Args::Get(const std::string& name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  for (const auto& f : cmd_->flags)
    if (f.name == name) return f.def;
  return {};
}

std::optional<int64_t> ParseInteger(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0) return std::nullopt;
  return static_cast<int64_t>(n);
}

std::optional<std::pair<std::string, int>> ParseHostPort(std::string_view text) {
  const auto colon = text.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  int port = 0;
  const char* end = text.data() + text.size();
  const auto [p, ec] = std::from_chars(text.data() + colon + 1, end, port);
  if (ec != std::errc() || p != end || port < 1 || port > 65535) return std::nullopt;
  return std::pair{std::string(text.substr(0, colon)), port};
}

Result<int64_t> Args::GetInt(const std::string& name) const {
  const std::string v = Get(name);
  const std::optional<int64_t> n = ParseInteger(v);
  if (!n) return Status::InvalidArgument("--" + name + " must be an integer, not '" + v + "'");
  return *n;
}

Result<int64_t> Args::GetInt(const std::string& name, int64_t lo, int64_t hi) const {
  IDEM_ASSIGN_OR_RETURN(int64_t n, GetInt(name));
  if (n < lo || n > hi)
    return Status::InvalidArgument("--" + name + " must be " + std::to_string(lo) + ".." + std::to_string(hi) +
                                   ", not " + std::to_string(n));
  return n;
}

Result<double> Args::GetDouble(const std::string& name, double lo, double hi) const {
  const std::string v = Get(name);
  char* end = nullptr;
  errno = 0;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno != 0 || !std::isfinite(d) || d < lo || d > hi) {
    char range[64];
    std::snprintf(range, sizeof range, "%g..%g", lo, hi);
    return Status::InvalidArgument("--" + name + " must be a number in " + range + ", not '" + v + "'");
  }
  return d;
}

void PrintHelp(const Command& cmd) {
  std::cout << "usage: idem " << cmd.name << " " << cmd.usage << "\n\n" << cmd.summary << "\n";
  if (!cmd.flags.empty()) std::cout << "\nflags:\n";
  for (const auto& f : cmd.flags) {
    std::string left = "  --" + f.name + (f.value.empty() ? "" : " " + f.value);
    std::cout << left;
    std::cout << std::string(left.size() < 28 ? 28 - left.size() : 1, ' ') << f.help;
    if (!f.def.empty()) std::cout << " (default: " << f.def << ")";
    std::cout << "\n";
  }
  std::cout << "  --help                    show this help\n";
  std::cout << "\nexit status: 0 ok, 1 a check failed, 2 bad usage, 3 runtime error\n";
}

int Fail(const std::string& cmd, const Status& s) {
  std::cerr << "idem " << cmd << ": " << s.ToString() << "\n";
  return s.code() == Code::kInvalidArgument ? kExitUsage : kExitError;
}

// Always valid JSON: a byte that is not part of valid UTF-8 (an id may hold
// any bytes) becomes U+FFFD.
std::string JsonString(std::string_view s) { return internal::JsonString(s); }

void AppendMetric(std::string& out, std::string_view name, std::string_view help, std::string_view type,
                  std::string_view labels, uint64_t value) {
  out.append("# HELP ").append(name).append(" ").append(help).append("\n# TYPE ").append(name).append(" ");
  out.append(type).append("\n").append(name);
  if (!labels.empty()) out.append("{").append(labels).append("}");
  out.append(" ").append(std::to_string(value)).append("\n");
}

std::string JsonArray(const std::vector<std::string>& items) {
  std::string out = "[";
  for (const auto& item : items) {
    if (out.size() > 1) out += ',';
    out += item;
  }
  out += ']';
  return out;
}

void Json::Key(const std::string& key) {
  if (!body_.empty()) body_ += ",";
  body_ += JsonString(key) + ":";
}
Json& Json::Add(const std::string& key, const std::string& v) {
  Key(key);
  body_ += JsonString(v);
  return *this;
}
Json& Json::Add(const std::string& key, int64_t v) {
  Key(key);
  body_ += std::to_string(v);
  return *this;
}
Json& Json::Add(const std::string& key, double v) {
  Key(key);
  if (!std::isfinite(v)) {
    body_ += "null";
  } else {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    body_ += buf;
  }
  return *this;
}
Json& Json::Add(const std::string& key, bool v) {
  Key(key);
  body_ += v ? "true" : "false";
  return *this;
}
Json& Json::AddRaw(const std::string& key, const std::string& json) {
  Key(key);
  body_ += json;
  return *this;
}

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)), total_(total), tty_(::isatty(STDERR_FILENO) == 1) {}
Progress::~Progress() { Done(); }
void Progress::Update(int64_t done) {
  if (!tty_ || total_ <= 0) return;
  int pct = static_cast<int>(done * 100 / total_);
  if (pct == last_pct_) return;
  last_pct_ = pct;
  int filled = pct * 30 / 100;
  std::fprintf(stderr, "\r%s [%s%s] %3d%% (%lld/%lld)", label_.c_str(), std::string(filled, '#').c_str(),
               std::string(30 - filled, '.').c_str(), pct, static_cast<long long>(done),
               static_cast<long long>(total_));
  std::fflush(stderr);
}
void Progress::Done() {
  if (tty_ && !finished_ && last_pct_ >= 0) std::fprintf(stderr, "\n");
  finished_ = true;
}

Result<std::unique_ptr<Store>> OpenStore(const std::string& url, bool create, int pool_size) {
  return idem::OpenStore(url, {.create_if_missing = create, .pool_size = pool_size});
}

bool IsClaimsOnlyUrl(const std::string& url) { return UrlScheme(url) == "redis"; }

std::string WithDefaultPoolSize(const std::string& url, int64_t connections, int64_t* pool) {
  if (pool != nullptr) *pool = 0;
  if (!IsPostgresScheme(url)) return url;
  Result<ParsedUrl> parsed = ParseUrl(url, "PostgreSQL URL");
  if (!parsed.ok()) return url;  // opening it names the error
  if (parsed->Has("idem_pool_size")) {
    if (pool != nullptr) {
      Result<int64_t> n = parsed->GetInt("idem_pool_size", 0, 1, 9999);
      *pool = n.ok() ? *n : 0;
    }
    return url;
  }
  if (pool != nullptr) *pool = connections;
  return url + (parsed->query.empty() ? "?" : "&") + "idem_pool_size=" + std::to_string(connections);
}

Result<OpenedClaims> OpenClaimStore(const std::string& url) {
#if IDEM_HAVE_REDIS
  if (IsClaimsOnlyUrl(url)) {
    IDEM_ASSIGN_OR_RETURN(std::unique_ptr<ClaimStore> rs, idem::OpenClaimStore(url));
    OpenedClaims out;
    out.kind = "redis";
    out.claims = rs.get();
    out.durability = "Redis: as durable as the server's appendonly/appendfsync settings; not atomic with a SQL write";
    out.owner = std::shared_ptr<ClaimStore>(std::move(rs));
    return out;
  }
#endif
  if (IsClaimsOnlyUrl(url)) return NotBuilt("the Redis claim store", "IDEM_WITH_REDIS");
  // A SQL store: opened as a Store, whose durability settings are read below.
  IDEM_ASSIGN_OR_RETURN(std::unique_ptr<Store> store, OpenStore(url, true));
  OpenedClaims out;
  out.kind = std::string(store->Kind());
  out.claims = store->claim_store();
  if (out.claims == nullptr) return Status::InvalidArgument(out.kind + " store keeps no claims");
  // What a claim's answer waits for, from the store's own settings.
  if (out.kind == "postgres") {
    IDEM_ASSIGN_OR_RETURN(auto tx, store->Begin());
    IDEM_ASSIGN_OR_RETURN(Rows r, tx->Query("SELECT current_setting('fsync'), current_setting('synchronous_commit')"));
    const std::string fsync = r.rows[0][0].AsText(), sync = r.rows[0][1].AsText();
    out.durability = "PostgreSQL fsync=" + fsync + " synchronous_commit=" + sync +
                     (fsync != "on"   ? ": nothing is flushed to disk (lost with the machine)"
                      : sync == "off" ? ": an answer may come before its commit is flushed (lost with the server)"
                                      : ": each claim and completion committed to disk before it answers");
  } else if (out.kind == "sqlite") {
    // As the store was opened (no query: a transaction would take the write
    // lock); the URL opened the store just above, so it parses.
    IDEM_ASSIGN_OR_RETURN(const sqlite::Store::Options o, sqlite::Store::ParseUrl(url));
    const sqlite::Synchronous level = o.synchronous;
    out.durability = level == sqlite::Synchronous::kFull
                         ? "SQLite WAL synchronous=FULL: each claim and completion fsynced before it answers"
                     : level == sqlite::Synchronous::kNormal
                         ? "SQLite WAL synchronous=NORMAL: commits survive the process, not the machine "
                           "(the WAL is not fsynced)"
                         : "SQLite WAL synchronous=OFF: nothing is fsynced (lost with the machine)";
  } else {
    out.durability = out.kind + ": each claim and completion as durable as the store's commit";
  }
  out.owner = std::shared_ptr<Store>(std::move(store));
  return out;
}

Result<std::pair<std::string, int>> ListenFlag(const Args& args) {
  const std::string listen = args.Get("listen");
  const auto host_port = ParseHostPort(listen);
  if (!host_port || host_port->first.empty())
    return Status::InvalidArgument("--listen must be HOST:PORT with a port 1..65535, got '" + listen + "'");
  return *host_port;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double PercentileOfSorted(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank > 0 ? rank - 1 : 0)];
}

Result<int> ListenOnLoopback(const std::string& who, int backlog, int& port, bool nonblocking) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0) return Status::Unavailable(who + ": socket: " + std::strerror(errno));
  const int yes = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, backlog) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int e = errno;
    ::close(fd);
    return Status::Unavailable(who + ": cannot listen on 127.0.0.1: " + std::strerror(e));
  }
  port = ntohs(a.sin_port);
  return fd;
}

Result<ScratchDir> ScratchDir::Make(std::string_view prefix) {
  std::error_code ec;
  std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  if (ec) tmp = "/tmp";
  std::string tmpl = (tmp / (std::string(prefix) + "-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr)
    return Status::Unavailable("cannot create a temporary directory in " + tmp.string());
  return ScratchDir(tmpl);
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

}  // namespace idem::cli
