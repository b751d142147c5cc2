// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/versioned.h"

#include <string>

namespace idem {

Result<bool> ApplyIfNewer(Transaction& tx, std::string_view entity, std::string_view key, int64_t version) {
  if (entity.empty() || entity.size() > 255) return Status::InvalidArgument("entity must be 1..255 bytes");
  if (key.empty() || key.size() > 255) return Status::InvalidArgument("key must be 1..255 bytes");
  // One statement: insert, or raise the version only when this one is newer;
  // a row comes back exactly when it was written.
  IDEM_ASSIGN_OR_RETURN(Rows rows, tx.Query("INSERT INTO idem_versions(entity, key, version) VALUES ($1, $2, $3)"
                                            " ON CONFLICT (entity, key) DO UPDATE SET version = excluded.version"
                                            " WHERE idem_versions.version < excluded.version RETURNING version",
                                            {std::string(entity), Blob{std::string(key)}, version}));
  return !rows.rows.empty();
}

}  // namespace idem
