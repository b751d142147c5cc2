// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// idem chaos: the files of a run. A work directory holds the oracle log, the
// consumer lives' journals, the provider's database and log, and a mark
// (.idem-chaos) saying a later run may delete them. std::filesystem's
// error_code overloads throughout: nothing here throws.
#ifndef IDEM_TOOLS_IDEM_CHAOS_WORKDIR_H_
#define IDEM_TOOLS_IDEM_CHAOS_WORKDIR_H_

#include <filesystem>
#include <string>
#include <vector>

#include "idem/result.h"

namespace idem::cli::chaos {

// The entries of `dir`.
Result<std::vector<std::filesystem::path>> ListDir(const std::string& dir);
// Removes `path` if it exists.
Status RemoveFile(const std::string& path);

// `dir` as the run's work directory: a fresh temporary directory when
// empty (set to its path), else refused when something other than a
// directory is there.
Status MakeRunDir(std::string& dir);

// Makes `dir` ready for a run: refuses (kInvalidArgument) a directory that
// holds files of a run's names without the mark (a user's provider.db is
// never deleted), creates DIR/journal, DIR/clock and DIR/fault, writes the mark, and deletes
// what an earlier run left (journals, clock files, --fault-cmd's logs, oracle.log, provider.db and its -wal/-shm,
// provider.log).
Status PrepareWorkDir(const std::string& dir);

// The run starts on an empty embedded queue (what an earlier run left would
// count as unexpected effects), so it deletes the queue file of `url` and
// its -wal and -shm. Only what is certainly an embedded queue file -- or
// nothing at all -- is deleted; anything else there is refused
// (kInvalidArgument naming the path and why) and left as it is.
Status ResetEmbeddedQueue(const std::string& url);

}  // namespace idem::cli::chaos

#endif  // IDEM_TOOLS_IDEM_CHAOS_WORKDIR_H_
