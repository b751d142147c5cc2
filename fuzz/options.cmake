# IDEM_BUILD_FUZZERS: the libFuzzer targets of fuzz/ (doc/reliability.md,
# "Fuzzing"). Included from the top-level CMakeLists.txt before any library is
# made, so that every idem library is compiled with -fsanitize=fuzzer-no-link
# (libFuzzer's coverage reaches the library code); the targets themselves link
# with -fsanitize=fuzzer (fuzz/CMakeLists.txt). Meant to be combined with the
# AddressSanitizer + UBSan flags.
option(IDEM_BUILD_FUZZERS "Build the libFuzzer targets of fuzz/ (needs clang++)" OFF)
if(IDEM_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "IDEM_BUILD_FUZZERS=ON needs clang++ (libFuzzer): configure with "
                        "-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang (found ${CMAKE_CXX_COMPILER_ID} "
                        "${CMAKE_CXX_COMPILER})")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
  enable_testing()
endif()
