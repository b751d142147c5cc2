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
  # Coverage in every library (the default, for fuzzing runs of their own) or
  # in the fuzz harnesses only: ./run test builds the fuzzers in its
  # AddressSanitizer variant, whose tests would run slower through coverage
  # callbacks in every comparison of the libraries.
  option(IDEM_FUZZ_COVERAGE_LIBS "Compile every idem library with libFuzzer's coverage (else the fuzz harnesses only)" ON)
  if(IDEM_FUZZ_COVERAGE_LIBS)
    add_compile_options(-fsanitize=fuzzer-no-link)
  endif()
  enable_testing()
endif()
