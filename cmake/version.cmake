# Writes OUT (deg/version.h) from IN (src/core/version.h.in) with VERSION and the checkout's
# `git describe`: run by every build (CMakeLists.txt's deg_version target), so the version a
# binary reports names the commit it was built from, not the one its build folder was configured
# at. configure_file leaves OUT untouched when its text is unchanged, so an unchanged commit
# recompiles nothing. cmake -DIN=... -DOUT=... -DVERSION=... -DROOT=... -P version.cmake
execute_process(COMMAND git describe --always --dirty --tags
                WORKING_DIRECTORY "${ROOT}"
                OUTPUT_VARIABLE DEG_GIT_DESCRIBE OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT DEG_GIT_DESCRIBE)
  set(DEG_GIT_DESCRIBE unknown)
endif()
set(PROJECT_VERSION "${VERSION}")
configure_file("${IN}" "${OUT}" @ONLY)
