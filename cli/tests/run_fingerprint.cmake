# Shared by the ctest helpers (cmake -P) that compare `renaissance run` fingerprints: run_fp(VAR
# ARGS...) runs `${CLI} run --model ${LAYOUT} --backend cpu --json ARGS` and sets VAR to the
# printed fingerprint; a failed run is a fatal error with its message.
function(run_fp out_var)
  execute_process(COMMAND ${CLI} run --model ${LAYOUT} --backend cpu --json ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "renaissance run ${ARGN} failed (${rc}): ${err}")
  endif()
  string(JSON fp GET "${out}" fingerprint)
  set(${out_var} "${fp}" PARENT_SCOPE)
endfunction()
