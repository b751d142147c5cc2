// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// Internal: fibers for idem::httplib::Server (Server::set_fibers). Each keep-alive
// connection runs as a fiber on one of a few loop threads instead of on a
// thread of its own. A fiber gives its thread up where a connection thread
// would sleep: waiting for the next bytes of a request (the socket in an
// epoll set), for a send to drain, or for its group of requests to commit
// (Idempotency's committer wakes it through the fiber's http::internal::Parker). On a machine with few cores this saves
// the kernel's thread switches and cross-core wake-ups that a thread per
// connection pays for every request.
//
// Everything else a handler does runs on the loop's thread as it would on a
// connection's: a handler that blocks (a network round trip, a sleep) holds
// every other connection of its loop for that time.
#ifndef IDEM_SRC_HTTPLIB_FIBER_H_
#define IDEM_SRC_HTTPLIB_FIBER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace idem::httplib::internal {

class Fiber;

// The fiber running on this thread, or null on a plain thread.
Fiber* CurrentFiber();

// Gives the thread up until Wake(current fiber) is called. Only for a wait
// that nothing but that Wake ends (a group's decision): the fiber is resumed
// once per Wake, and Wake may come before Park (it is then resumed at once).
void ParkUntilWoken();

// Resumes `fiber` (parked in ParkUntilWoken). Thread-safe; from any thread.
void Wake(Fiber* fiber);

// Waits until the fiber's socket is readable (or writable) or `timeout_ms`
// passed; from a fiber only. 1: ready (or an error to be read from the
// socket); 0: timeout.
int WaitForSocket(bool write, int64_t timeout_ms);

// The loop threads. Under AddressSanitizer and ThreadSanitizer every switch
// between a loop and a fiber is announced to the sanitizer (its fiber API),
// so each knows which stack runs.
class Loops {
 public:
  explicit Loops(int threads);
  ~Loops();  // waits for every fiber to end, then joins the threads
  Loops(const Loops&) = delete;
  Loops& operator=(const Loops&) = delete;

  // Runs `body` as a fiber watching socket `fd`, on one of the threads (round
  // robin), and returns at once. When `body` has returned, the socket leaves
  // the loop's epoll set and then `body` is destroyed (so a socket it owns is
  // closed only after that: its number cannot be reused while watched).
  void Spawn(int fd, std::function<void()> body);

  class Loop;  // one thread's epoll set and fibers

 private:
  std::vector<std::unique_ptr<Loop>> loops_;
  std::atomic<uint64_t> next_{0};
};

}  // namespace idem::httplib::internal

#endif  // IDEM_SRC_HTTPLIB_FIBER_H_
