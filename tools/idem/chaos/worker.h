// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem chaos: one consumer life, the process the supervisor starts (as
// `idem chaos --worker SLOT --life N ...`), arms with kill points and faults
// through its environment, and kills. It consumes the source with the real
// Inbox and Consumer (or, with --broken, a consumer that makes on purpose the
// mistakes the pattern exists to prevent), charges the provider over HTTP,
// commits the effect row with the marker, and journals what it received,
// stalled, lost and acknowledged (journal.h).
#ifndef IDEM_TOOLS_IDEM_CHAOS_WORKER_H_
#define IDEM_TOOLS_IDEM_CHAOS_WORKER_H_

#include <string>

#include "chaos/config.h"

namespace idem::cli::chaos {

// The stage-2 effect table (the two-stage pipeline): n (the order applied),
// outbox_id, key, seq, causation_id.
std::string CreateShipmentsSql();

// Runs consumer (or, with Role::kRelay, relay: relay.h) cfg.slot's life cfg.life until SIGTERM or SIGINT (or its
// kill); returns the process's exit code.
int RunWorker(const Config& cfg);

}  // namespace idem::cli::chaos

#endif  // IDEM_TOOLS_IDEM_CHAOS_WORKER_H_
