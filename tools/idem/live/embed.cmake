# Writes OUT, a C++ file defining idem::cli::live::kLivePage as the text of IN
# (the live view's page, compiled into the idem command).
file(READ "${IN}" _page)
string(FIND "${_page}" ")idem_asset\"" _bad)
if(NOT _bad EQUAL -1)
  message(FATAL_ERROR "${IN} holds the raw string's end marker )idem_asset\"")
endif()
file(WRITE "${OUT}" "// Made from tools/idem/live/index.html by tools/idem/live/embed.cmake: do not edit.\n"
  "#include \"live/web.h\"\n"
  "namespace idem::cli::live {\n"
  "const char* const kLivePage = R\"idem_asset(${_page})idem_asset\";\n"
  "}  // namespace idem::cli::live\n")
