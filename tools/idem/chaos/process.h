// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem chaos: the processes of a run -- starting them (consumer lives and the
// provider are this same executable), a port for the provider, its health.
#ifndef IDEM_TOOLS_IDEM_CHAOS_PROCESS_H_
#define IDEM_TOOLS_IDEM_CHAOS_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "idem/result.h"

namespace idem::cli::chaos {

// The path of this executable.
std::string SelfExe();

// Starts `argv` with stdout and stderr appended to `log`, stdin from
// /dev/null, and the environment of this process minus the fault settings
// (IDEM_KILL_AT, IDEM_FAULT_VFS), plus `env`.
Result<pid_t> Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env, const std::string& log);

// A port that is free now, for a server the run restarts many times on the
// same port. It lies below Linux's ephemeral range (32768-60999): no
// outgoing connection -- not even a client's connect to this very port
// while nothing listens, which can connect a socket to itself -- can hold
// it when the server comes back.
Result<int> FreePort();

// Whether the provider on 127.0.0.1:`port` answers GET /health with 200.
bool ProviderHealthy(int port);

}  // namespace idem::cli::chaos

#endif  // IDEM_TOOLS_IDEM_CHAOS_PROCESS_H_
