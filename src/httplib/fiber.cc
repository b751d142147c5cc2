// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "httplib/fiber.h"

#include "http/parker.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <unordered_set>
#include <utility>

// The sanitizers' fiber API, compiled in only under the sanitizer: each
// switch between a loop's stack and a fiber's is announced, so AddressSanitizer
// knows which stack is live (and its fake stacks) and ThreadSanitizer keeps
// one shadow state per fiber, with a switch ordering what came before it.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define IDEM_FIBER_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define IDEM_FIBER_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(IDEM_FIBER_ASAN)
#define IDEM_FIBER_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__) && !defined(IDEM_FIBER_TSAN)
#define IDEM_FIBER_TSAN 1
#endif
#ifdef IDEM_FIBER_ASAN
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef IDEM_FIBER_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace idem::httplib::internal {
namespace {

// A fiber's stack: only the pages it touches take memory. SQLite, cpp-httplib
// and a handler's JSON fit in a fraction of it.
constexpr size_t kStackBytes = size_t{1024} * 1024;
// How long a loop sleeps at most, and how often it looks at deadlines.
constexpr int kTickMs = 10;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What a stack switch tells the sanitizers; empty without them.
struct SanitizerFiber {
#ifdef IDEM_FIBER_ASAN
  void* fake_stack = nullptr;  // AddressSanitizer's fake stack of the side switched away from
#endif
#ifdef IDEM_FIBER_TSAN
  void* tsan = nullptr;  // ThreadSanitizer's fiber
#endif
};

// Before a switch from `from` (null: it ends for good) to `to`, whose stack
// is [bottom, bottom + size).
void StartSwitch([[maybe_unused]] SanitizerFiber* from, [[maybe_unused]] const SanitizerFiber& to,
                 [[maybe_unused]] const void* bottom, [[maybe_unused]] size_t size) {
#ifdef IDEM_FIBER_ASAN
  __sanitizer_start_switch_fiber(from != nullptr ? &from->fake_stack : nullptr, bottom, size);
#endif
#ifdef IDEM_FIBER_TSAN
  __tsan_switch_to_fiber(to.tsan, 0);
#endif
}

// First thing after a switch lands on `self`'s stack; the stack switched
// from is written to *from_bottom and *from_size when they are not null.
void FinishSwitch([[maybe_unused]] SanitizerFiber* self, [[maybe_unused]] const void** from_bottom,
                  [[maybe_unused]] size_t* from_size) {
#ifdef IDEM_FIBER_ASAN
  __sanitizer_finish_switch_fiber(self != nullptr ? self->fake_stack : nullptr, from_bottom, from_size);
#endif
}

}  // namespace

class Loops::Loop {
 public:
  Loop();
  ~Loop();
  // Queues a new fiber, or a parked one to resume; from any thread.
  void Post(Fiber* f);
  // From fiber `f`: back to the loop (for good once f is kDone).
  void Yield(Fiber* f);
  // From a fiber's first instruction (notes the loop's stack for switches back).
  void Entered();
  void WatchWrites(Fiber* f, bool on);

 private:
  void Main();
  void Enqueue(Fiber* f);
  void Resume(Fiber* f);
  void Finish(Fiber* f);

  int epfd_ = -1, evfd_ = -1;
  ucontext_t main_ctx_{};
  std::mutex mu_;
  std::vector<Fiber*> inbox_;  // new fibers and wakes from other threads
  bool stopping_ = false;
  std::deque<Fiber*> ready_;
  std::unordered_set<Fiber*> fibers_;
  // The loop thread's own side of each switch (its stack: from a fiber's
  // first switch back; its tsan fiber: the thread's).
  SanitizerFiber main_san_;
  const void* main_bottom_ = nullptr;
  size_t main_size_ = 0;
  std::thread thread_;
};

// A fiber is also what the core's group commit parks (http/parker.h).
class Fiber final : public http::internal::Parker {
 public:
  void Park() override { ParkUntilWoken(); }
  void Unpark() override { Wake(this); }
  enum class State { kNew, kRunning, kReady, kWaitFd, kParked, kDone };
  Loops::Loop* loop = nullptr;
  int fd = -1;
  std::function<void()> body;
  ucontext_t ctx{};
  SanitizerFiber san;
  void* stack = nullptr;
  State state = State::kNew;
  bool queued = false;
  bool fd_ready = false;
  // Bytes (or the peer's end) came while the fiber was not waiting for
  // them: its next wait to read returns at once (the socket is edge-
  // triggered, so that edge will not come again).
  bool in_pending = false;
  bool wait_write = false;
  int64_t deadline_ms = 0;
};

namespace {
thread_local Fiber* tl_fiber = nullptr;

void Trampoline() {
  Fiber* f = tl_fiber;
  f->loop->Entered();
  try {
    f->body();
  } catch (...) {  // the connection ends; the server goes on
  }
  f->state = Fiber::State::kDone;
  // Back to the loop for good: it frees this stack after the switch.
  tl_fiber = nullptr;
  f->loop->Yield(f);
}
}  // namespace

Fiber* CurrentFiber() { return tl_fiber; }

namespace {
http::internal::Parker* CurrentFiberParker() { return tl_fiber; }
}  // namespace

void ParkUntilWoken() {
  Fiber* f = tl_fiber;
  f->state = Fiber::State::kParked;
  f->loop->Yield(f);
}

void Wake(Fiber* fiber) { fiber->loop->Post(fiber); }

int WaitForSocket(bool write, int64_t timeout_ms) {
  Fiber* f = tl_fiber;  // its socket is in the loop's epoll set since it started
  if (!write && f->in_pending) {
    f->in_pending = false;
    return 1;
  }
  f->state = Fiber::State::kWaitFd;
  f->wait_write = write;
  f->fd_ready = false;
  f->deadline_ms = NowMs() + std::max<int64_t>(0, timeout_ms);
  if (write) f->loop->WatchWrites(f, true);
  f->loop->Yield(f);
  if (write) f->loop->WatchWrites(f, false);
  return f->fd_ready ? 1 : 0;
}

Loops::Loop::Loop() {
  epfd_ = ::epoll_create1(EPOLL_CLOEXEC);
  evfd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (epfd_ < 0 || evfd_ < 0) throw std::runtime_error("idem::httplib::Server: cannot make an epoll set for fibers");
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;  // the eventfd
  ::epoll_ctl(epfd_, EPOLL_CTL_ADD, evfd_, &ev);
  thread_ = std::thread([this] { Main(); });
}

Loops::Loop::~Loop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  const uint64_t one = 1;
  (void)!::write(evfd_, &one, sizeof one);
  thread_.join();
  ::close(evfd_);
  ::close(epfd_);
}

void Loops::Loop::Post(Fiber* f) {
  bool first;
  {
    std::lock_guard lock(mu_);
    first = inbox_.empty();
    inbox_.push_back(f);
  }
  // One write per batch: the loop takes the whole inbox each time it looks.
  if (first) {
    const uint64_t one = 1;
    (void)!::write(evfd_, &one, sizeof one);
  }
}

void Loops::Loop::Yield(Fiber* f) {
  const bool last = f->state == Fiber::State::kDone;
  StartSwitch(last ? nullptr : &f->san, main_san_, main_bottom_, main_size_);
  ::swapcontext(&f->ctx, &main_ctx_);
  FinishSwitch(&f->san, nullptr, nullptr);  // resumed (never reached when last)
}

void Loops::Loop::Entered() { FinishSwitch(nullptr, &main_bottom_, &main_size_); }

void Loops::Loop::WatchWrites(Fiber* f, bool on) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET | (on ? EPOLLOUT : 0u);
  ev.data.ptr = f;
  ::epoll_ctl(epfd_, EPOLL_CTL_MOD, f->fd, &ev);
}

void Loops::Loop::Enqueue(Fiber* f) {
  if (f->queued) return;
  f->queued = true;
  f->state = f->state == Fiber::State::kNew ? Fiber::State::kNew : Fiber::State::kReady;
  ready_.push_back(f);
}

void Loops::Loop::Resume(Fiber* f) {
  if (f->state == Fiber::State::kNew) {
    f->stack = ::mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (f->stack == MAP_FAILED) {
      f->stack = nullptr;
      f->state = Fiber::State::kDone;  // the connection is closed unserved
      return;
    }
    ::mprotect(f->stack, 4096, PROT_NONE);  // a guard page below the stack
    ::getcontext(&f->ctx);
    f->ctx.uc_stack.ss_sp = f->stack;
    f->ctx.uc_stack.ss_size = kStackBytes;
    f->ctx.uc_link = nullptr;
    ::makecontext(&f->ctx, &Trampoline, 0);
#ifdef IDEM_FIBER_TSAN
    f->san.tsan = __tsan_create_fiber(0);
#endif
  }
  f->state = Fiber::State::kRunning;
  tl_fiber = f;
  StartSwitch(&main_san_, f->san, f->stack, kStackBytes);
  ::swapcontext(&main_ctx_, &f->ctx);
  FinishSwitch(&main_san_, nullptr, nullptr);
  tl_fiber = nullptr;
}

void Loops::Loop::Finish(Fiber* f) {
  ::epoll_ctl(epfd_, EPOLL_CTL_DEL, f->fd, nullptr);
  fibers_.erase(f);
#ifdef IDEM_FIBER_TSAN
  if (f->san.tsan != nullptr) __tsan_destroy_fiber(f->san.tsan);
#endif
  if (f->stack != nullptr) ::munmap(f->stack, kStackBytes);
  delete f;  // its body (and what the body owns) after the socket left the epoll set
}

void Loops::Loop::Main() {
#ifdef IDEM_FIBER_TSAN
  main_san_.tsan = __tsan_get_current_fiber();
#endif
  std::vector<Fiber*> inbox;
  epoll_event events[64];
  int64_t next_check = NowMs() + kTickMs;
  for (;;) {
    bool stop;
    {
      std::lock_guard lock(mu_);
      inbox.swap(inbox_);
      stop = stopping_;
    }
    for (Fiber* f : inbox) {
      if (f->state == Fiber::State::kNew) {
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
        ev.data.ptr = f;
        ::epoll_ctl(epfd_, EPOLL_CTL_ADD, f->fd, &ev);
        fibers_.insert(f);
      }
      Enqueue(f);  // new, or woken by another thread
    }
    inbox.clear();
    while (!ready_.empty()) {
      Fiber* f = ready_.front();
      ready_.pop_front();
      f->queued = false;
      Resume(f);
      if (f->state == Fiber::State::kDone) Finish(f);
    }
    if (stop && fibers_.empty()) return;
    int timeout = kTickMs;
    {
      std::lock_guard lock(mu_);
      if (!inbox_.empty()) timeout = 0;
    }
    const int n = ::epoll_wait(epfd_, events, 64, timeout);
    for (int i = 0; i < n; ++i) {
      auto* f = static_cast<Fiber*>(events[i].data.ptr);
      if (f == nullptr) {
        uint64_t count;
        (void)!::read(evfd_, &count, sizeof count);
        continue;
      }
      const uint32_t e = events[i].events;
      const bool in = (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0;
      const bool out = (e & (EPOLLOUT | EPOLLHUP | EPOLLERR)) != 0;
      const bool waiting = f->state == Fiber::State::kWaitFd;
      if (in && !(waiting && !f->wait_write)) f->in_pending = true;
      if (waiting && (f->wait_write ? out : in)) {
        f->fd_ready = true;
        Enqueue(f);
      }
    }
    const int64_t now = NowMs();
    if (now >= next_check) {
      next_check = now + kTickMs;
      for (Fiber* f : fibers_)
        if (f->state == Fiber::State::kWaitFd && f->deadline_ms <= now) Enqueue(f);  // timed out: fd_ready false
    }
  }
}

Loops::Loops(int threads) {
  http::internal::SetParkerLookup(&CurrentFiberParker);  // group commit parks the running fiber
  for (int i = 0; i < std::max(1, threads); ++i) loops_.push_back(std::make_unique<Loop>());
}

Loops::~Loops() = default;

void Loops::Spawn(int fd, std::function<void()> body) {
  auto* f = new Fiber;
  f->fd = fd;
  f->body = std::move(body);
  f->loop = loops_[next_.fetch_add(1, std::memory_order_relaxed) % loops_.size()].get();
  f->loop->Post(f);
}

}  // namespace idem::httplib::internal
