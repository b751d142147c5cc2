// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
// Put first on the include path by the http.HeadersIncludeNoHttpLibrary
// check: a public idem/http header that includes cpp-httplib fails to compile.
#error "a public idem/http header includes <httplib.h>"
