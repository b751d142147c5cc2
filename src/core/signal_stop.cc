// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "core/signal_stop.h"

#include "idem/signals.h"

#include <errno.h>
#include <signal.h>

#include <atomic>
#include <mutex>
#include <thread>

namespace idem::internal {
namespace {

// The attached objects live in slots the handler reads without a lock: an
// object is published after its stop function, and a detach clears the
// object, then waits until no handler is running, so that a stop function
// never runs on an object whose destructor has returned. Slots come in
// chunks that are never freed (a handler may be walking them).
struct Slot {
  std::atomic<void*> object{nullptr};
  std::atomic<SignalStopFn> stop{nullptr};
};
struct Chunk {
  Slot slots[16];
  std::atomic<Chunk*> next{nullptr};
};

Chunk g_first;
std::atomic<int> g_running{0};  // handlers running now

extern "C" void IdemSignalStop(int) {
  const int saved_errno = errno;  // a stop function's system call must not change the interrupted code's
  g_running.fetch_add(1);
  for (Chunk* c = &g_first; c != nullptr; c = c->next.load()) {
    for (Slot& s : c->slots) {
      if (void* object = s.object.load()) s.stop.load()(object);
    }
  }
  g_running.fetch_sub(1);
  errno = saved_errno;
}

// Attach and detach take turns; the handler never takes it.
std::mutex g_mu;
int g_attached = 0;  // guarded by g_mu
struct sigaction g_old_int {};
struct sigaction g_old_term {};  // guarded by g_mu: the handlers before the first attach

Slot* Find(const void* object) {
  for (Chunk* c = &g_first; c != nullptr; c = c->next.load())
    for (Slot& s : c->slots)
      if (s.object.load() == object) return &s;
  return nullptr;
}

void Clear(Slot& s) {
  s.object.store(nullptr);
  while (g_running.load() != 0) std::this_thread::yield();
}

void RestoreIfLast() {
  if (g_attached != 0) return;
  ::sigaction(SIGINT, &g_old_int, nullptr);
  ::sigaction(SIGTERM, &g_old_term, nullptr);
}

}  // namespace

void AttachToSignals(void* object, SignalStopFn stop) {
  if (object == nullptr) return;
  std::lock_guard<std::mutex> l(g_mu);
  if (Find(object) != nullptr) return;
  Slot* free = Find(nullptr);
  if (free == nullptr) {
    Chunk* last = &g_first;
    while (last->next.load() != nullptr) last = last->next.load();
    Chunk* added = new Chunk();  // never freed: see Chunk
    last->next.store(added);
    free = &added->slots[0];
  }
  free->stop.store(stop);
  free->object.store(object);
  if (g_attached++ == 0) {
    struct sigaction sa {};
    sa.sa_handler = IdemSignalStop;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, &g_old_int);
    ::sigaction(SIGTERM, &sa, &g_old_term);
  }
}

void DetachFromSignals(const void* object) noexcept {
  if (object == nullptr) return;
  std::lock_guard<std::mutex> l(g_mu);
  Slot* s = Find(object);
  if (s == nullptr) return;
  Clear(*s);
  --g_attached;
  RestoreIfLast();
}

void DetachAllFromSignals() noexcept {
  std::lock_guard<std::mutex> l(g_mu);
  if (g_attached == 0) return;
  for (Chunk* c = &g_first; c != nullptr; c = c->next.load())
    for (Slot& s : c->slots)
      if (s.object.load() != nullptr) Clear(s);
  g_attached = 0;
  RestoreIfLast();
}

}  // namespace idem::internal

namespace idem {
void StopOnSignals(std::nullptr_t) { internal::DetachAllFromSignals(); }
}  // namespace idem
