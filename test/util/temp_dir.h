// Copyright idem authors. SPDX-License-Identifier: Apache-2.0
//
// TempDir for the tests and the fuzz targets: the test kit's own
// (idem/testing/throwaway.h).
#ifndef IDEM_TEST_UTIL_TEMP_DIR_H_
#define IDEM_TEST_UTIL_TEMP_DIR_H_

#include "idem/testing/throwaway.h"

#endif  // IDEM_TEST_UTIL_TEMP_DIR_H_
