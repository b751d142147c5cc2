// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
#include "idem/version.h"

namespace idem {

const char* Version() { return IDEM_VERSION_STRING; }

}  // namespace idem
