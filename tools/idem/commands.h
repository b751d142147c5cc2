// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// The idem command's subcommands. Each has a declaration (flags, help) and a
// Run function that returns an exit code (see cli.h).
#ifndef IDEM_TOOLS_IDEM_COMMANDS_H_
#define IDEM_TOOLS_IDEM_COMMANDS_H_

#include "cli.h"

namespace idem::cli {

const Command& DemoCommand();
int RunDemo(const Args& args);

const Command& BenchCommand();
int RunBench(const Args& args);
int RunBenchPeers(const Args& args);      // idem bench peers (bench_peers.cc)
int RunBenchPurge(const Args& args);      // idem bench purge (bench_purge.cc)
int RunBenchClaims(const Args& args);     // idem bench claims (bench_claims.cc)
int RunBenchSource(const Args& args);     // idem bench source (bench_source.cc)
int RunBenchCallFirst(const Args& args);  // idem bench call-first (bench_call_first.cc)
int RunBenchWebhooks(const Args& args);   // idem bench webhooks (bench_webhooks.cc)
int RunBenchOutbox(const Args& args);     // idem bench outbox-add and relay (bench_outbox.cc)
int RunBenchPooler(const Args& args);     // idem bench pooler (bench_pooler.cc)
// How many 4 KiB write + fdatasync cycles the disk holding `dir` completes per
// second, over `seconds`: the ceiling of durable commits (one fdatasync each)
// per second (bench.cc).
Result<double> MeasureFsync(const std::string& dir, double seconds);

const Command& SchemaCommand();
int RunSchema(const Args& args);

const Command& InspectCommand();
int RunInspect(const Args& args);

const Command& ProviderCommand();
int RunProvider(const Args& args);  // provider_cmd.cc

const Command& GatewayCommand();
int RunGateway(const Args& args);  // gateway_cmd.cc

const Command& WebhooksCommand();
int RunWebhooks(const Args& args);  // webhooks_cmd.cc

const Command& RunCommand();
int RunRun(const Args& args);  // run_cmd.cc
const Command& PublishCommand();
int RunPublish(const Args& args);  // run_cmd.cc

const Command& ChaosCommand();
int RunChaos(const Args& args);  // chaos.cc
const Command& ChaosGatewayCommand();
int RunChaosGateway(const Args& args);  // chaos/gateway.cc: idem chaos gateway

const Command& RelayCommand();
int RunRelay(const Args& args);  // relay_cmd.cc

const Command& PurgeCommand();
int RunPurge(const Args& args);

}  // namespace idem::cli

#endif  // IDEM_TOOLS_IDEM_COMMANDS_H_
