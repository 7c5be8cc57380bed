# Shared by the ctest helpers (cmake -P) that check what a `renaissance` command did.
#
# expect_exit_and_output(CONTEXT WANT REGEX): the command just run (rc, out and err in the
# caller, as execute_process sets them) must have exited WANT with stdout+stderr matching REGEX;
# CONTEXT starts the failure message.
function(expect_exit_and_output context want regex)
  if(NOT "${rc}" STREQUAL "${want}")
    message(FATAL_ERROR "${context}: expected exit ${want}, got '${rc}'\nstdout: ${out}\nstderr: ${err}")
  endif()
  if(NOT "${out}${err}" MATCHES "${regex}")
    message(FATAL_ERROR "${context}: output does not match '${regex}':\n${out}${err}")
  endif()
endfunction()

# expect_one_error_line(ERR CONTEXT): the stderr text ERR must be exactly one line starting
# "renaissance: error: " (the CLI's one-line failure report); CONTEXT starts the failure message.
function(expect_one_error_line err context)
  string(REGEX MATCHALL "\n" newlines "${err}")
  list(LENGTH newlines n)
  if(NOT n EQUAL 1 OR NOT err MATCHES "^renaissance: error: ")
    message(FATAL_ERROR "${context}expected exactly one 'renaissance: error:' line on stderr, got: ${err}")
  endif()
endfunction()
