// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: the one piece behind every public StopOnSignals (Consumer,
// OutboxRelay, httplib::Server, http::WebhookReceiver; idem/signals.h). While
// at least one object is attached, SIGINT and SIGTERM call each attached
// object's stop function; the handlers in place before the first attach are
// restored when the last object is detached.
#ifndef IDEM_SRC_CORE_SIGNAL_STOP_H_
#define IDEM_SRC_CORE_SIGNAL_STOP_H_

namespace idem::internal {

// Called from the signal handler: must be async-signal-safe (an atomic
// store, a shutdown(2)).
using SignalStopFn = void (*)(void* object) noexcept;

// Attaches `object` (once: attaching it again changes nothing); installs the
// handlers at the first attach. Any number of objects at once.
void AttachToSignals(void* object, SignalStopFn stop);
// Detaches `object` if attached (its destructor calls this): after the
// return, no signal handler is running its stop function. The last one
// detached restores the previous handlers.
void DetachFromSignals(const void* object) noexcept;
// Detaches every object and restores the previous handlers.
void DetachAllFromSignals() noexcept;

// A public StopOnSignals(T*): attaches `object` to call its Stop() (which
// must be async-signal-safe); nullptr detaches every object.
template <typename T>
void StopOnSignalsOf(T* object) {
  if (object == nullptr) return DetachAllFromSignals();
  AttachToSignals(object, [](void* o) noexcept { static_cast<T*>(o)->Stop(); });
}

}  // namespace idem::internal

#endif  // IDEM_SRC_CORE_SIGNAL_STOP_H_
