# The seams between production code, test facilities and store internals
# (CTest idem_seams, label unit). Reads the tree's includes and the library
# targets' link lines and fails, naming each file or target, when
#   - a production component (its src/<c>/ files, its public headers) includes
#     a test facility: idem/testing/..., src/testing/..., GoogleTest;
#   - a production library links the test kit (idem_testing) or GoogleTest;
#   - a source (the embedded queue, Redis Streams, RabbitMQ, Kafka) includes a
#     store's internals (src/sqlite/, src/sql/, src/postgres/) or links a store.
# The kill points are the library's own internal seam (src/core/kill_point.h);
# the SQLite driver (src/sqlite_driver/) is what the store and the queue share.
#
# usage: cmake -DSRC=<source dir> -DLINKS=<file of "target|link libraries" lines> -P seams.cmake
cmake_minimum_required(VERSION 3.25)
if(NOT SRC OR NOT LINKS)
  message(FATAL_ERROR "usage: cmake -DSRC=... -DLINKS=... -P seams.cmake")
endif()

set(_production core sql sqlite_driver sqlite postgres redis embedded amqp kafka http httplib aws sqs pubsub dynamodb open)
set(_problems "")

# The quoted or bracketed #include lines of `file` matching `regex`, as "file:line: text".
function(_bad_includes file regex out)
  file(STRINGS "${file}" lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  set(found "")
  foreach(l IN LISTS lines)
    if(l MATCHES "${regex}")
      file(RELATIVE_PATH rel "${SRC}" "${file}")
      string(STRIP "${l}" l)
      list(APPEND found "${rel}: ${l}")
    endif()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# 1. Production code includes no test facility.
set(_testing_re "[<\"](idem/testing/|testing/|gtest/|gmock/)")
foreach(c IN LISTS _production)
  file(GLOB_RECURSE files "${SRC}/src/${c}/*.cc" "${SRC}/src/${c}/*.h")
  if(c STREQUAL "core")
    file(GLOB headers "${SRC}/include/idem/*.h")
  else()
    file(GLOB_RECURSE headers "${SRC}/include/idem/${c}/*.h")
  endif()
  foreach(f IN LISTS files headers)
    _bad_includes("${f}" "${_testing_re}" found)
    foreach(p IN LISTS found)
      list(APPEND _problems "production code includes a test facility: ${p}")
    endforeach()
  endforeach()
endforeach()

# 2. A source includes no store's internals.
file(GLOB _sources "${SRC}/src/embedded/*" "${SRC}/src/redis/stream*" "${SRC}/src/amqp/*" "${SRC}/src/kafka/*" "${SRC}/src/sqs/*" "${SRC}/src/pubsub/*")
foreach(f IN LISTS _sources)
  _bad_includes("${f}" "[<\"](sqlite|sql|postgres|dynamodb)/" found)
  foreach(p IN LISTS found)
    list(APPEND _problems "a source includes a store's internals: ${p}")
  endforeach()
endforeach()

# 3. The link lines: "idem_<c>|<its link libraries>" per library target built.
file(STRINGS "${LINKS}" _links)
foreach(l IN LISTS _links)
  if(NOT l MATCHES "^idem_([a-z_]+)\\|(.*)$")
    continue()
  endif()
  set(c "${CMAKE_MATCH_1}")
  set(libs "${CMAKE_MATCH_2}")
  string(REPLACE ";" " " shown "${libs}")
  if(c IN_LIST _production OR c STREQUAL "redis_streams")
    if(libs MATCHES "(idem_testing|idem::testing|GTest::|gtest|gmock)")
      list(APPEND _problems "production library idem_${c} links a test facility (${CMAKE_MATCH_1}): ${shown}")
    endif()
  endif()
  if(c MATCHES "^(embedded|redis_streams|amqp|kafka)$")
    if(libs MATCHES "(idem_sqlite|idem::sqlite|idem_sql|idem_postgres|idem::postgres)([^_a-z]|$)")
      list(APPEND _problems "source idem_${c} links a store (${CMAKE_MATCH_1}): ${shown}")
    endif()
  endif()
endforeach()

if(_problems)
  list(JOIN _problems "\n  " _text)
  message(FATAL_ERROR "seams broken:\n  ${_text}")
endif()
list(LENGTH _links _n)
message(STATUS "seams hold: no production component includes or links a test facility, no source a store's internals (${_n} libraries)")
