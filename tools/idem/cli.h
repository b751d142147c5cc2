// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The idem command's small shared parts: declared flags with generated
// --help, exit codes, a JSON object writer, progress on a terminal.
#ifndef IDEM_TOOLS_IDEM_CLI_H_
#define IDEM_TOOLS_IDEM_CLI_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/claims.h"
#include "idem/status.h"
#include "idem/store.h"

namespace idem::cli {

// Exit codes scripts can trust.
inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;  // ran, but a check failed (demo totals differ)
inline constexpr int kExitUsage = 2;        // bad flags or arguments
inline constexpr int kExitError = 3;        // runtime error: unreachable, corrupt, locked, ...

struct FlagSpec {
  std::string name;   // without "--"
  std::string value;  // placeholder ("N", "URL"); empty for a boolean flag
  std::string def;    // default, shown in --help
  std::string help;
  bool repeatable = false;  // may be given more than once (GetAll); else twice is an error
};

struct Command {
  std::string name;
  std::string summary;
  std::string usage;  // text after "idem <name> "
  std::vector<FlagSpec> flags;
  int max_positional = 0;  // arguments that are not flags (inspect SCOPE KEY, bench SUBCOMMAND)
};

class Args {
 public:
  // Parses argv (after the command name) against the command's flags.
  // Returns an error naming the unknown flag, the missing value, the flag
  // given twice (unless repeatable) or the argument the command takes none of.
  static Result<Args> Parse(const Command& cmd, int argc, char** argv);

  bool help() const { return help_; }
  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  std::string Get(const std::string& name) const;
  // InvalidArgument when the value is not an integer (in [lo, hi]).
  Result<int64_t> GetInt(const std::string& name) const;
  Result<int64_t> GetInt(const std::string& name, int64_t lo, int64_t hi) const;
  // InvalidArgument when the value is not a finite number in [lo, hi].
  Result<double> GetDouble(const std::string& name, double lo, double hi) const;
  bool Bool(const std::string& name) const { return Has(name); }
  const std::vector<std::string>& positional() const { return positional_; }
  // Every value of a repeatable flag, in order (Get gives the last).
  std::vector<std::string> GetAll(const std::string& name) const {
    auto it = all_.find(name);
    return it == all_.end() ? std::vector<std::string>{} : it->second;
  }

 private:
  const Command* cmd_ = nullptr;
  bool help_ = false;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
  std::map<std::string, std::vector<std::string>> all_;
};

// The peers' result line ("peer=... store=... unique=... deliveries=...
// seconds=... deliveries_per_s=... effects=..."), then, when !ok, their
// "CORRECTNESS CHECK FAILED"; returns the exit code.
int PeerResult(const std::string& peer, std::string_view store, int64_t unique, int64_t deliveries, double seconds,
               int64_t effects, bool ok);

// "90s", "15m", "24h", "7d", or plain milliseconds.
Result<int64_t> ParseDurationMs(const std::string& s);

// Prints the command's help to stdout.
void PrintHelp(const Command& cmd);
// A whole decimal number in int64_t's range and nothing after it (strtoll's
// syntax); nullopt when `text` is not one.
std::optional<int64_t> ParseInteger(const std::string& text);

// The median of `v` (0 for none): the figure of record of a benchmark's rounds.
double Median(std::vector<double> v);
// The `p` quantile (0..1, nearest rank) of `sorted`, sorted ascending (0 for none).
double PercentileOfSorted(const std::vector<double>& sorted, double p);

// A socket listening on 127.0.0.1 at a port the system picks (`port`), with
// `backlog`; an error naming `who` otherwise.
Result<int> ListenOnLoopback(const std::string& who, int backlog, int& port, bool nonblocking);

// A directory of its own under the system's temporary directory ("PREFIX-"
// and six characters), removed with everything in it when this goes out of
// scope.
class ScratchDir {
 public:
  static Result<ScratchDir> Make(std::string_view prefix);
  ScratchDir(ScratchDir&& o) noexcept : path_(std::exchange(o.path_, "")) {}
  ScratchDir& operator=(ScratchDir&&) = delete;
  ~ScratchDir();
  const std::string& path() const { return path_; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};
// "HOST:PORT" with a port 1..65535 and nothing after it (HOST may be
// empty); nullopt when not.
std::optional<std::pair<std::string, int>> ParseHostPort(std::string_view text);

// The --listen flag of a server command: HOST:PORT with a host and a port
// 1..65535; kInvalidArgument naming the flag otherwise.
Result<std::pair<std::string, int>> ListenFlag(const Args& args);
// Prints "idem <cmd>: <status>" to stderr and returns kExitUsage for invalid
// arguments, kExitError otherwise.
int Fail(const std::string& cmd, const Status& s);

// One JSON object, fields in insertion order.
class Json {
 public:
  Json& Add(const std::string& key, const std::string& v);
  Json& Add(const std::string& key, const char* v) { return Add(key, std::string(v)); }
  Json& Add(const std::string& key, int64_t v);
  Json& Add(const std::string& key, uint64_t v) { return Add(key, static_cast<int64_t>(v)); }
  Json& Add(const std::string& key, int v) { return Add(key, static_cast<int64_t>(v)); }
  Json& Add(const std::string& key, double v);
  Json& Add(const std::string& key, bool v);
  Json& AddRaw(const std::string& key, const std::string& json);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void Key(const std::string& key);
  std::string body_;
};
std::string JsonString(std::string_view s);
// "[a,b,...]" from already-encoded JSON values.
std::string JsonArray(const std::vector<std::string>& items);

// One metric in the Prometheus text format (HELP, TYPE, one sample) appended
// to `out`. `type` is "counter" or "gauge"; `labels` is "" or `k="v",...`.
void AppendMetric(std::string& out, std::string_view name, std::string_view help, std::string_view type,
                  std::string_view labels, uint64_t value);

// A one-line progress bar on stderr, only when stderr is a terminal.
class Progress {
 public:
  Progress(std::string label, int64_t total);
  ~Progress();
  void Update(int64_t done);
  void Done();

 private:
  std::string label_;
  int64_t total_;
  bool tty_;
  bool finished_ = false;
  int last_pct_ = -1;
};

// Opens a store from a URL ("sqlite:PATH", a bare path, "postgres://...") by idem::OpenStore.
// Without `create`, a missing database file is an error (inspecting must not create one).
// `pool_size` > 0 sizes a PostgreSQL store's connection pool.
Result<std::unique_ptr<Store>> OpenStore(const std::string& url, bool create = true, int pool_size = 0);

// A claim store (two-phase mode) from a URL: sqlite:PATH, postgres://... or
// redis://...; `owner` keeps it alive. `durability` says in words what a
// completed record survives (for benchmark reports).
struct OpenedClaims {
  std::shared_ptr<void> owner;
  ClaimStore* claims = nullptr;
  std::string kind;
  std::string durability;
};
Result<OpenedClaims> OpenClaimStore(const std::string& url);
// A PostgreSQL URL (`url` given whole, query included) with
// idem_pool_size=`connections` added unless it names a pool size itself;
// any other URL as it is. `pool` (when given) gets the pool size the URL
// now asks for (0 for other stores, or an idem_pool_size that is not a
// number: opening the store names that error).
std::string WithDefaultPoolSize(const std::string& url, int64_t connections, int64_t* pool = nullptr);
// Whether `url` names a store that keeps claims only (redis://).
bool IsClaimsOnlyUrl(const std::string& url);

}  // namespace idem::cli

#endif  // IDEM_TOOLS_IDEM_CLI_H_
