// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem chaos: one relay life of the two-stage pipeline (--pipeline
// two-stage), the process the supervisor starts as `idem chaos --worker SLOT
// --worker-mode relay ...`, arms with the relay's kill points and kills. It
// runs an OutboxRelay from the store under test to the second source through
// a publisher that journals every hand-over and confirm
// (DIR/relay/<slot>-<life>.log): "P <id> <key> <seq> <ns>" before a batch
// is handed over (ns: the system-wide monotonic clock), "K <id>" for each
// message the broker confirmed, "T <published> <republished>" (the relay's
// stats) when the life stops cleanly. With --broken
// relay-ack-before-confirm it settles each fetched batch as sent before it
// publishes it, so a kill in between loses those messages.
#ifndef IDEM_TOOLS_IDEM_CHAOS_RELAY_H_
#define IDEM_TOOLS_IDEM_CHAOS_RELAY_H_

#include "chaos/config.h"

namespace idem::cli::chaos {

// The broken relay's mode (--broken).
inline constexpr const char* kBrokenRelay = "relay-ack-before-confirm";

// Runs relay cfg.slot's life cfg.life until SIGTERM or SIGINT (or its kill);
// returns the process's exit code.
int RunRelay(const Config& cfg);

}  // namespace idem::cli::chaos

#endif  // IDEM_TOOLS_IDEM_CHAOS_RELAY_H_
