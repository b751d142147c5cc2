// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem chaos: a consumer life's journal, DIR/journal/<slot>-<life>.log, one
// line per event: "<event> <id>". The events: R (a delivery received), S (a
// receive stalled past the lease), L (an ack lost on purpose: the consumer
// was told OK, the broker never heard), A (an ack passed to the broker), F
// (the fault VFS returned its n-th fault; the id is n), X (the source
// refused an ack or a lease renewal: the lease was lost, another delivery may
// hold the message), C (the life's clock offset changed; the id is the
// offset in ms), H (the handler ran for the message, inside its
// transaction), D (stage 2 of the two-stage pipeline: a delivery the source
// numbers its first). The relays' journals are relay.h's. The oracle reads them back (oracle.h); the supervisor reads
// a paused life's to see it taken over and what it did after (supervisor.h).
#ifndef IDEM_TOOLS_IDEM_CHAOS_JOURNAL_H_
#define IDEM_TOOLS_IDEM_CHAOS_JOURNAL_H_

#include <fcntl.h>
#include <unistd.h>

#include <string>

namespace idem::cli::chaos {

// Appends one line per event to the life's journal; one write(2) per line
// (O_APPEND), so a SIGKILL loses at most the line being written, and the OS
// keeps what was written (a process crash is not a power cut).
class Journal {
 public:
  explicit Journal(const std::string& path)
      : fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644)) {}
  ~Journal() {
    if (fd_ >= 0) ::close(fd_);
  }
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;
  bool ok() const { return fd_ >= 0; }
  void Line(char event, const std::string& id) {
    std::string line;
    line.reserve(id.size() + 3);
    line += event;
    line += ' ';
    line += id;
    line += '\n';
    if (::write(fd_, line.data(), line.size()) < 0) {
      // Nothing to do: the check counts what the journal holds.
    }
  }

 private:
  int fd_;
};

}  // namespace idem::cli::chaos

#endif  // IDEM_TOOLS_IDEM_CHAOS_JOURNAL_H_
