# Shared by the ctest helpers (cmake -P) that compare `renaissance run` fingerprints: run_fp(VAR
# ARGS...) runs `${CLI} run --model ${LAYOUT} --backend cpu --json ARGS` and sets VAR to the
# printed fingerprint; a failed run is a fatal error with its message. precision_cell below
# spells a mixed-precision cell as run flags.
function(run_fp out_var)
  execute_process(COMMAND ${CLI} run --model ${LAYOUT} --backend cpu --json ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "renaissance run ${ARGN} failed (${rc}): ${err}")
  endif()
  string(JSON fp GET "${out}" fingerprint)
  set(${out_var} "${fp}" PARENT_SCOPE)
endfunction()

# expect_option_changes_run(WHAT PLAIN ONE TWO): the fingerprints ONE and TWO of a run with the
# option WHAT names, on 1 and 2 threads, must agree (no thread count changes a bit) and differ
# from PLAIN, the same run without the option (else the option did nothing).
function(expect_option_changes_run what plain one two)
  if(NOT one STREQUAL two)
    message(FATAL_ERROR "${what}: the fingerprint depends on the thread count (${one} vs ${two})")
  endif()
  if(one STREQUAL plain)
    message(FATAL_ERROR "${what} did not change the fingerprint (${one})")
  endif()
endfunction()

# precision_cell(CELL KIND_VAR PRECISION_VAR FLAGS_VAR): a cell "kind:bf16|fp16:nearest|stochastic"
# as the optimizer kind and the `run` flags of its precision and rounding.
function(precision_cell cell kind_var precision_var flags_var)
  string(REPLACE ":" ";" parts "${cell}")
  list(GET parts 0 kind)
  list(GET parts 1 precision)
  list(GET parts 2 rounding)
  set(flags --precision ${precision})
  if(rounding STREQUAL "stochastic")
    list(APPEND flags --stochastic-rounding)
  endif()
  set(${kind_var} ${kind} PARENT_SCOPE)
  set(${precision_var} ${precision} PARENT_SCOPE)
  set(${flags_var} ${flags} PARENT_SCOPE)
endfunction()
