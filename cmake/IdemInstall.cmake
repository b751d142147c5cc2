# Installs idem's libraries as components (doc/install.md).
#
# Input: IDEM_INSTALL_TARGETS, the library targets built (idem_core, idem_sqlite,
# ...). A target's component is its EXPORT_NAME. For each component this
# installs
#   lib/libidem_<c>.a                          the library
#   lib/cmake/idem/idemTargets-<c>.cmake       its own export set (idem::<c>)
#   lib/cmake/idem/idem-<c>-component.cmake    what it needs: idem components,
#                                              CMake packages, pkg-config modules
#   lib/pkgconfig/idem-<c>.pc                  the same for pkg-config
#   include/idem/...                           its own headers only (core: also the
#                                              generated idem/version.h), less
#                                              those the target's IDEM_HEADERS_NOT_BUILT
#                                              lists (their code is not in this build)
# and once lib/cmake/idem/idemConfig.cmake, which loads only the requested
# components, their idem dependencies and their third-party dependencies, and
# lib/cmake/idem/idemConfigVersion.cmake, which says which requested versions
# this install satisfies.
#
# The dependencies are read from each target's INTERFACE_LINK_LIBRARIES (for
# a static library its PRIVATE ones appear there as $<LINK_ONLY:...>), so a
# target's link line is the one place they are written. An imported target
# not in the table below is an error: add it (its CMake package and its
# pkg-config module). A PkgConfig::<PREFIX> target needs no entry: its module
# is the one pkg_check_modules(<PREFIX> ...) found.
# cmake --install also takes --component <c> (each component's files, and
# "tools" for the idem command).

include(CMakePackageConfigHelpers)

# Imported target -> "<find_package arguments, ;-separated as |>" and "<pkg-config module>".
set(_idem_import_Threads__Threads "Threads" "")
set(_idem_import_OpenSSL__Crypto "OpenSSL" "libcrypto")
set(_idem_import_OpenSSL__SSL "OpenSSL" "libssl")
set(_idem_import_SQLite__SQLite3 "SQLite3" "sqlite3")
set(_idem_import_PostgreSQL__PostgreSQL "PostgreSQL" "libpq")
set(_idem_import_nlohmann_json__nlohmann_json "nlohmann_json|3" "nlohmann_json")

set(IDEM_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/idem)
set(IDEM_PKGCONFIG_DIR ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
file(RELATIVE_PATH _idem_pc_to_prefix "/prefix/${IDEM_PKGCONFIG_DIR}" "/prefix")
string(REGEX REPLACE "/$" "" _idem_pc_to_prefix "${_idem_pc_to_prefix}")

# The component of an idem target (idem_x or idem::x), or "".
function(_idem_component_of item out)
  set(t "${item}")
  if(TARGET "${t}")
    get_target_property(aliased "${t}" ALIASED_TARGET)
    if(aliased)
      set(t "${aliased}")
    endif()
  endif()
  if(t MATCHES "^idem_" AND TARGET "${t}")
    get_target_property(name "${t}" EXPORT_NAME)
    if(NOT name)
      string(REGEX REPLACE "^idem_" "" name "${t}")
    endif()
    set(${out} "${name}" PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()

# What a target needs, from its interface link libraries:
#   <out>_IDEM      idem components (targets)
#   <out>_PACKAGES  find_package arguments, "|"-separated
#   <out>_PKG       pkg-config prefixes=modules for PkgConfig:: targets ("HIREDIS=hiredis")
#   <out>_PC        pkg-config modules for the .pc file's Requires
#   <out>_PCLIBS    extra linker flags for the .pc file (-pthread)
function(_idem_needs target out)
  get_target_property(libs ${target} INTERFACE_LINK_LIBRARIES)
  if(NOT libs)
    set(libs "")
  endif()
  set(idem_targets "")
  set(packages "")
  set(pkg "")
  set(pc "")
  set(pclibs "")
  set(files "")
  foreach(item IN LISTS libs)
    if(item MATCHES "^\\$<BUILD_INTERFACE:")
      continue()  # build-only: not part of the installed interface
    endif()
    if(item MATCHES "^\\$<LINK_ONLY:(.*)>$")
      set(item "${CMAKE_MATCH_1}")
    endif()
    if(item MATCHES "^\\$<BUILD_INTERFACE:")
      continue()  # build-only, inside $<LINK_ONLY:...>
    elseif(item MATCHES "^\\$<INSTALL_INTERFACE:(.*)>$")
      set(item "${CMAKE_MATCH_1}")
    endif()
    if(IS_ABSOLUTE "${item}")
      list(APPEND pclibs "${item}")  # a library file linked by path (e.g. the cpp-httplib runtime)
      list(APPEND files "${item}")
      continue()
    endif()
    if(item MATCHES "^\\$<")
      message(FATAL_ERROR "${target} links '${item}': cmake/IdemInstall.cmake does not know what that needs once installed")
    endif()
    _idem_component_of("${item}" comp)
    if(comp)
      get_target_property(aliased "${item}" ALIASED_TARGET)
      if(aliased)
        set(item "${aliased}")
      endif()
      list(APPEND idem_targets "${item}")
      continue()
    endif()
    if(item MATCHES "^PkgConfig::(.+)$")
      set(prefix "${CMAKE_MATCH_1}")
      if(NOT ${prefix}_MODULE_NAME)
        message(FATAL_ERROR "${target} links ${item}, but pkg_check_modules(${prefix} ...) recorded no module name")
      endif()
      list(APPEND pkg "${prefix}=${${prefix}_MODULE_NAME}")
      list(APPEND pc "${${prefix}_MODULE_NAME}")
      continue()
    endif()
    string(REPLACE "::" "__" key "${item}")
    string(MAKE_C_IDENTIFIER "${key}" key)
    if(NOT DEFINED _idem_import_${key})
      message(FATAL_ERROR "${target} links '${item}': add it to the table in cmake/IdemInstall.cmake "
                          "(its CMake package and its pkg-config module)")
    endif()
    list(GET _idem_import_${key} 0 package)
    list(GET _idem_import_${key} 1 module)
    list(APPEND packages "${package}")
    if(module)
      list(APPEND pc "${module}")
    elseif(item STREQUAL "Threads::Threads")
      list(APPEND pclibs "-pthread")
    endif()
  endforeach()
  foreach(v idem_targets packages pkg pc pclibs files)
    list(REMOVE_DUPLICATES ${v})
  endforeach()
  set(${out}_IDEM "${idem_targets}" PARENT_SCOPE)
  set(${out}_PACKAGES "${packages}" PARENT_SCOPE)
  set(${out}_PKG "${pkg}" PARENT_SCOPE)
  set(${out}_PC "${pc}" PARENT_SCOPE)
  set(${out}_PCLIBS "${pclibs}" PARENT_SCOPE)
  set(${out}_FILES "${files}" PARENT_SCOPE)
endfunction()

# The headers of the component of target `t`, relative to include/.
function(_idem_headers t comp out)
  set(base ${PROJECT_SOURCE_DIR}/include)
  set(files "")
  if(comp STREQUAL "core")
    file(GLOB files CONFIGURE_DEPENDS RELATIVE ${base} ${base}/idem/*.h)
    list(REMOVE_ITEM files idem/open.h)
  elseif(comp STREQUAL "open")
    set(files idem/open.h)
  elseif(comp STREQUAL "redis_streams")
    file(GLOB files CONFIGURE_DEPENDS RELATIVE ${base} ${base}/idem/redis/stream*.h ${base}/idem/redis_streams/*.h)
  else()
    file(GLOB_RECURSE files CONFIGURE_DEPENDS RELATIVE ${base} ${base}/idem/${comp}/*.h)
    if(comp STREQUAL "redis")
      list(FILTER files EXCLUDE REGEX "^idem/redis/stream")
    endif()
  endif()
  get_target_property(not_built ${t} IDEM_HEADERS_NOT_BUILT)
  if(not_built)
    list(REMOVE_ITEM files ${not_built})
  endif()
  set(${out} "${files}" PARENT_SCOPE)
endfunction()

# Internal libraries the installed ones link (e.g. a static helper library)
# are installed too, as components nobody needs to name.
set(_idem_all ${IDEM_INSTALL_TARGETS})
set(_idem_i 0)
list(LENGTH _idem_all _idem_n)
while(_idem_i LESS _idem_n)
  list(GET _idem_all ${_idem_i} _idem_t)
  _idem_needs(${_idem_t} _idem_dep)
  foreach(_idem_d IN LISTS _idem_dep_IDEM)
    if(NOT _idem_d IN_LIST _idem_all)
      list(APPEND _idem_all ${_idem_d})
    endif()
  endforeach()
  math(EXPR _idem_i "${_idem_i} + 1")
  list(LENGTH _idem_all _idem_n)
endwhile()

set(IDEM_INSTALLED_COMPONENTS "")
foreach(_idem_t IN LISTS _idem_all)
  _idem_component_of(${_idem_t} _c)
  list(APPEND IDEM_INSTALLED_COMPONENTS ${_c})
  _idem_needs(${_idem_t} _n)
  set(_requires "")
  foreach(_d IN LISTS _n_IDEM)
    _idem_component_of(${_d} _dc)
    list(APPEND _requires ${_dc})
  endforeach()

  install(TARGETS ${_idem_t} EXPORT idem-${_c} COMPONENT ${_c}
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT idem-${_c} NAMESPACE idem:: FILE idemTargets-${_c}.cmake DESTINATION ${IDEM_CMAKE_DIR} COMPONENT ${_c})

  _idem_headers(${_idem_t} ${_c} _headers)
  foreach(_h IN LISTS _headers)
    get_filename_component(_dir ${_h} DIRECTORY)
    install(FILES include/${_h} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/${_dir} COMPONENT ${_c})
  endforeach()
  if(_c STREQUAL "core")
    # Generated from project(idem VERSION ...) by the root CMakeLists.txt.
    install(FILES ${PROJECT_BINARY_DIR}/include/idem/version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/idem COMPONENT core)
  endif()

  # What idemConfig.cmake needs to load this component.
  set(_file ${PROJECT_BINARY_DIR}/cmake/idem-${_c}-component.cmake)
  file(WRITE ${_file}.in
    "# idem component ${_c}: read by idemConfig.cmake before idemTargets-${_c}.cmake.\n"
    "set(_idem_requires \"${_requires}\")   # idem components, loaded first\n"
    "set(_idem_packages \"${_n_PACKAGES}\")   # find_package(...) each, arguments |-separated\n"
    "set(_idem_pkgconfig \"${_n_PKG}\")   # pkg_check_modules(PREFIX IMPORTED_TARGET module) each\n"
    "set(_idem_files \"${_n_FILES}\")   # library files linked by path, which must exist\n")
  configure_file(${_file}.in ${_file} COPYONLY)
  install(FILES ${_file} DESTINATION ${IDEM_CMAKE_DIR} COMPONENT ${_c})

  # pkg-config: idem-<c>.pc requires the idem components and the modules it links.
  set(_pc_requires "")
  foreach(_r IN LISTS _requires)
    list(APPEND _pc_requires idem-${_r})
  endforeach()
  list(APPEND _pc_requires ${_n_PC})
  list(JOIN _pc_requires " " _pc_requires)
  list(JOIN _n_PCLIBS " " _pc_extra)
  get_target_property(_type ${_idem_t} TYPE)
  if(_type STREQUAL "INTERFACE_LIBRARY")
    set(_pc_libs "")
  else()
    set(_pc_libs "-L\${libdir} -l$<TARGET_LINKER_FILE_BASE_NAME:${_idem_t}>")
  endif()
  if(_c STREQUAL "core")
    set(_pc_cflags "-I\${includedir}")
  else()
    set(_pc_cflags "")
  endif()
  string(STRIP "${_pc_libs} ${_pc_extra}" _pc_libs)
  file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/pkgconfig/idem-${_c}.pc CONTENT
"prefix=\${pcfiledir}/${_idem_pc_to_prefix}
libdir=\${prefix}/${CMAKE_INSTALL_LIBDIR}
includedir=\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}

Name: idem-${_c}
Description: ${PROJECT_DESCRIPTION}: component ${_c}
Version: ${PROJECT_VERSION}
Requires: ${_pc_requires}
Libs: ${_pc_libs}
Cflags: ${_pc_cflags}
")
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/idem-${_c}.pc DESTINATION ${IDEM_PKGCONFIG_DIR} COMPONENT ${_c})
endforeach()

# Every component the project has (to tell "unknown" from "not installed").
set(IDEM_KNOWN_COMPONENTS core sqlite embedded postgres redis redis_streams http httplib amqp kafka sqs pubsub dynamodb open)
foreach(_c IN LISTS IDEM_INSTALLED_COMPONENTS)
  if(NOT _c IN_LIST IDEM_KNOWN_COMPONENTS)
    list(APPEND IDEM_KNOWN_COMPONENTS ${_c})
  endif()
endforeach()
configure_package_config_file(cmake/idemConfig.cmake.in ${PROJECT_BINARY_DIR}/idemConfig.cmake
  INSTALL_DESTINATION ${IDEM_CMAKE_DIR})
# Which requested versions this install satisfies. 0.x: every incompatible
# change moves the minor number, so only the same MAJOR.MINOR is compatible
# (find_package(idem 0.1) refuses 0.2.x; find_package(idem 0.2) takes any
# 0.2.x; CHANGELOG.md, doc/migration.md).
write_basic_package_version_file(${PROJECT_BINARY_DIR}/idemConfigVersion.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/idemConfig.cmake ${PROJECT_BINARY_DIR}/idemConfigVersion.cmake
  DESTINATION ${IDEM_CMAKE_DIR} COMPONENT core)
message(STATUS "idem components: ${IDEM_INSTALLED_COMPONENTS}")
