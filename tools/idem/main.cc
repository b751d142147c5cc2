// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem: exactly-once effects on at-least-once delivery. See `idem --help`.
#include <cstring>
#include <iostream>

#include "cli.h"
#include "commands.h"
#include "idem/env.h"
#include "idem/version.h"
#if IDEM_KILL_POINTS
#include "idem/testing/fault_vfs.h"
#include "idem/testing/kill_points.h"
#endif

namespace {

// A command is compiled in when the components it needs are built; one that
// is not keeps its name and says which build options bring it (exit 2).
struct Entry {
  const char* name;
  const idem::cli::Command& (*command)();  // null: not built into this idem
  int (*run)(const idem::cli::Args&);
  const char* needs;  // when not built: the configure flags that build it
};

#if IDEM_HAVE_HTTP
#define IDEM_HTTP_COMMAND(name, command, run) \
  { name, command, run, "" }
#else
#define IDEM_HTTP_COMMAND(name, command, run) \
  { name, nullptr, nullptr, "-DIDEM_WITH_HTTP=ON -DIDEM_WITH_HTTPLIB=ON" }
#endif
#if IDEM_HAVE_HTTP && IDEM_HAVE_TESTING
#define IDEM_CRASH_COMMAND(name, command, run) \
  { name, command, run, "" }
#else
#define IDEM_CRASH_COMMAND(name, command, run) \
  { name, nullptr, nullptr, "-DIDEM_WITH_HTTP=ON -DIDEM_WITH_HTTPLIB=ON -DIDEM_WITH_KILL_POINTS=ON" }
#endif

// idem version (and idem --version): the version of the idem library this
// command is built with (idem/version.h), for bug reports and scripts.
const idem::cli::Command& VersionCommand() {
  static const idem::cli::Command c{"version",
                                    "Print the version of idem this command is built with (also: idem --version).",
                                    "[--json]",
                                    {{"json", "", "", "print one JSON object: {\"version\":\"MAJOR.MINOR.PATCH\"}"}}};
  return c;
}

int RunVersion(const idem::cli::Args& args) {
  if (args.Bool("json")) {
    std::cout << idem::cli::Json().Add("version", idem::Version()).str() << "\n";
  } else {
    std::cout << "idem " << idem::Version() << "\n";
  }
  return idem::cli::kExitOk;
}

const Entry kEntries[] = {
    IDEM_CRASH_COMMAND("demo", idem::cli::DemoCommand, idem::cli::RunDemo),
    {"bench", idem::cli::BenchCommand, idem::cli::RunBench, ""},
    {"schema", idem::cli::SchemaCommand, idem::cli::RunSchema, ""},
    {"inspect", idem::cli::InspectCommand, idem::cli::RunInspect, ""},
    {"purge", idem::cli::PurgeCommand, idem::cli::RunPurge, ""},
    IDEM_HTTP_COMMAND("provider", idem::cli::ProviderCommand, idem::cli::RunProvider),
    IDEM_HTTP_COMMAND("gateway", idem::cli::GatewayCommand, idem::cli::RunGateway),
    IDEM_HTTP_COMMAND("webhooks", idem::cli::WebhooksCommand, idem::cli::RunWebhooks),
    IDEM_CRASH_COMMAND("chaos", idem::cli::ChaosCommand, idem::cli::RunChaos),
    IDEM_CRASH_COMMAND("chaos gateway", idem::cli::ChaosGatewayCommand, idem::cli::RunChaosGateway),
    {"run", idem::cli::RunCommand, idem::cli::RunRun, ""},
    {"publish", idem::cli::PublishCommand, idem::cli::RunPublish, ""},
    {"relay", idem::cli::RelayCommand, idem::cli::RunRelay, ""},
    {"version", VersionCommand, RunVersion, ""},
};

int NotBuilt(const Entry& e) {
  std::cerr << "idem " << e.name << ": not built into this idem; configure idem with " << e.needs
            << " (see doc/install.md)\n";
  return idem::cli::kExitUsage;
}

void PrintUsage(std::ostream& os) {
  os << "usage: idem <command> [flags]\n\n"
        "Exactly-once effects on top of at-least-once delivery: the idempotent consumer (inbox)\n"
        "and idempotency keys (claims, HTTP Idempotency-Key), on SQLite, PostgreSQL and Redis, behind the\nembedded "
        "queue, Redis Streams, RabbitMQ or Kafka.\n\ncommands:\n";
  for (const Entry& e : kEntries) {
    const std::string name = e.name;
    const std::string summary =
        e.command ? e.command().summary : std::string("(not built: configure with ") + e.needs + ")";
    os << "  " << name << std::string(name.size() < 10 ? 10 - name.size() : 1, ' ')
       << summary.substr(0, summary.find('\n')) << "\n";
  }
  os << "\n`idem <command> --help` describes a command's flags; `idem --version` prints the version.\n"
        "exit status: 0 ok, 1 a check failed, 2 bad usage, 3 runtime error\n";
}

}  // namespace

int main(int argc, char** argv) {
#if IDEM_KILL_POINTS
  // A build with kill points: IDEM_KILL_AT arms one, and the fault VFS is
  // registered with SQLite (a store opens through it with ?vfs=idem-fault;
  // IDEM_FAULT_VFS configures it).
  idem::ArmKillPointFromEnv();
  if (auto vfs = idem::sqlite::FaultVfs::Install(); !vfs.ok()) {
    std::cerr << "idem: " << vfs.status() << "\n";
    return idem::cli::kExitUsage;
  }
#endif
  if (argc < 2) {
    PrintUsage(std::cerr);
    return idem::cli::kExitUsage;
  }
  std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    PrintUsage(std::cout);
    return idem::cli::kExitOk;
  }
  if (name == "--version") name = "version";                                  // idem --version [--json]
  if (name == "chaos" && argc > 2 && std::strcmp(argv[2], "gateway") == 0) {  // idem chaos gateway [flags]
    name = "chaos gateway";
    --argc;
    ++argv;
  }
  for (const Entry& e : kEntries) {
    if (e.name != name) continue;
    if (!e.command) return NotBuilt(e);
    const auto& cmd = e.command();
    auto args = idem::cli::Args::Parse(cmd, argc - 2, argv + 2);
    if (!args.ok()) return idem::cli::Fail(name, args.status());
    if (args->help()) {
      idem::cli::PrintHelp(cmd);
      return idem::cli::kExitOk;
    }
    return e.run(*args);
  }
  std::cerr << "idem: unknown command '" << name << "'\n\n";
  PrintUsage(std::cerr);
  return idem::cli::kExitUsage;
}
