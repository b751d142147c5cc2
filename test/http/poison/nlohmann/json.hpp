// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
// See ../httplib.h: nlohmann::json is used inside src/http only.
#error "a public idem/http header includes <nlohmann/json.hpp>"
