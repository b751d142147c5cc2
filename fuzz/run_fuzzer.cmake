# One fuzz.<name> test: copies the seed corpus to WORK (the repository is
# never written), runs FUZZER over it, then fuzzes for SECONDS more.
# cmake -DFUZZER=... -DCORPUS=... -DDICT=... -DWORK=... -DSECONDS=... -P run_fuzzer.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/corpus ${WORK}/artifacts)
file(GLOB _seeds ${CORPUS}/*)
if(NOT _seeds)
  message(FATAL_ERROR "no seeds in ${CORPUS}")
endif()
file(COPY ${_seeds} DESTINATION ${WORK}/corpus)
set(_dict_arg "")
if(DICT)
  set(_dict_arg -dict=${DICT})
endif()
execute_process(
  COMMAND ${FUZZER} ${_dict_arg} -max_total_time=${SECONDS} -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
          -artifact_prefix=${WORK}/artifacts/ ${WORK}/corpus
  WORKING_DIRECTORY ${WORK}
  RESULT_VARIABLE _rc)
if(NOT _rc EQUAL 0)
  file(GLOB _found ${WORK}/artifacts/*)
  message(FATAL_ERROR "${FUZZER} failed (${_rc}); its input: ${_found}")
endif()
