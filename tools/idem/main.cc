// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem: exactly-once effects on at-least-once delivery. See `idem --help`.
#include <cstring>
#include <iostream>

#include "cli.h"
#include "commands.h"
#include "idem/env.h"
#include "idem/testing/kill_points.h"

namespace {

struct Entry {
  const idem::cli::Command& (*command)();
  int (*run)(const idem::cli::Args&);
};

const Entry kEntries[] = {
    {idem::cli::DemoCommand, idem::cli::RunDemo},       {idem::cli::BenchCommand, idem::cli::RunBench},
    {idem::cli::SchemaCommand, idem::cli::RunSchema},   {idem::cli::InspectCommand, idem::cli::RunInspect},
    {idem::cli::PurgeCommand, idem::cli::RunPurge},     {idem::cli::ProviderCommand, idem::cli::RunProvider},
    {idem::cli::ChaosCommand, idem::cli::RunChaos},
    {idem::cli::RunCommand, idem::cli::RunRun},         {idem::cli::PublishCommand, idem::cli::RunPublish},
};

void PrintUsage(std::ostream& os) {
  os << "usage: idem <command> [flags]\n\n"
        "Exactly-once effects on top of at-least-once delivery: the idempotent consumer (inbox)\n"
        "and idempotency keys (claims, HTTP Idempotency-Key), on SQLite, PostgreSQL and Redis, behind the\nembedded queue, Redis Streams, RabbitMQ or Kafka.\n\ncommands:\n";
  for (const Entry& e : kEntries) {
    const auto& c = e.command();
    os << "  " << c.name << std::string(c.name.size() < 10 ? 10 - c.name.size() : 1, ' ') << c.summary.substr(0, c.summary.find('\n')) << "\n";
  }
  os << "\n`idem <command> --help` describes a command's flags.\n"
        "exit status: 0 ok, 1 a check failed, 2 bad usage, 3 runtime error\n";
}

}  // namespace

int main(int argc, char** argv) {
  idem::ArmKillPointFromEnv();
  if (argc < 2) {
    PrintUsage(std::cerr);
    return idem::cli::kExitUsage;
  }
  std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    PrintUsage(std::cout);
    return idem::cli::kExitOk;
  }
  for (const Entry& e : kEntries) {
    const auto& cmd = e.command();
    if (cmd.name != name) continue;
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
