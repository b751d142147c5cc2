// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// StopOnSignals: SIGINT and SIGTERM stop idem's long-running objects
// gracefully, with no signal handling of your own. One call per object, the
// same for each kind; its overload lives beside the kind:
//
//   idem::StopOnSignals(consumer.get());   // idem/consumer.h: Consumer::Stop()
//   idem::StopOnSignals(relay.get());      // idem/outbox_relay.h: OutboxRelay::Stop()
//   idem::StopOnSignals(server.get());     // idem/httplib/server.h: stops listening
//   idem::StopOnSignals(receiver.get());   // idem/http/webhook.h: WebhookReceiver::Stop()
//
// Several objects may be attached at once (a service's consumer, its outbox
// relay and its HTTP server): a signal stops every one of them. The first
// attach installs handlers for SIGINT and SIGTERM; when the last object is
// detached (StopOnSignals(nullptr), or the destructor of each object
// attached) the handlers in place before it are restored. Attaching an
// object again changes nothing.
//
// Thread safety: call from any thread. The handlers only make each object's
// async-signal-safe stop request.
#ifndef IDEM_SIGNALS_H_
#define IDEM_SIGNALS_H_

#include <cstddef>

namespace idem {

// Detaches every object and restores the handlers SIGINT and SIGTERM had
// before the first attach.
void StopOnSignals(std::nullptr_t);

}  // namespace idem

#endif  // IDEM_SIGNALS_H_
