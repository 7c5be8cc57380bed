# ctest helper (cmake -P): `renaissance run --dampening` (torch's SGD dampening). A damped
# sgd_momentum run is the same with --threads 1 and 2, differs from the undamped run, reports the
# value in --json; a run of 6 steps saved after 3 and resumed (without the option: the checkpoint
# carries it) gives the fingerprint of 6 uninterrupted damped steps; another --dampening on that
# resume is refused with exit 2 naming it; sgd_nesterov and adamw refuse a dampening (exit 2).
# Input: CLI, LAYOUT, WORK (a scratch folder).
include(${CMAKE_CURRENT_LIST_DIR}/run_fingerprint.cmake)

file(MAKE_DIRECTORY ${WORK})
set(ckpt ${WORK}/run.ckpt)
foreach(mode decoupled l2)
  run_fp(plain --optimizer sgd_momentum --weight-decay-mode ${mode} --weight-decay 0.01 --steps 6)
  run_fp(zero --optimizer sgd_momentum --weight-decay-mode ${mode} --weight-decay 0.01 --steps 6 --dampening 0)
  run_fp(d1 --optimizer sgd_momentum --weight-decay-mode ${mode} --weight-decay 0.01 --steps 6 --dampening 0.3 --threads 1)
  run_fp(d2 --optimizer sgd_momentum --weight-decay-mode ${mode} --weight-decay 0.01 --steps 6 --dampening 0.3 --threads 2)
  if(NOT zero STREQUAL plain)
    message(FATAL_ERROR "${mode}: --dampening 0 changed the fingerprint (${zero} vs ${plain})")
  endif()
  expect_option_changes_run("${mode} --dampening 0.3" ${plain} ${d1} ${d2})
  file(REMOVE ${ckpt})
  run_fp(first --optimizer sgd_momentum --weight-decay-mode ${mode} --weight-decay 0.01 --steps 3 --dampening 0.3
               --checkpoint ${ckpt})
  run_fp(resumed --optimizer sgd_momentum --steps 6 --resume ${ckpt})
  message("${mode}: undamped ${plain}, dampening 0.3 ${d1}, 3 + resumed 3 ${resumed}")
  if(NOT resumed STREQUAL d1)
    message(FATAL_ERROR "${mode}: resuming a --dampening checkpoint did not continue the damped run (${resumed} vs ${d1})")
  endif()
endforeach()

execute_process(COMMAND ${CLI} run --model ${LAYOUT} --backend cpu --optimizer sgd_momentum --steps 2 --dampening 0.25
                        --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(JSON dampening ERROR_VARIABLE missing GET "${out}" dampening)
if(NOT rc EQUAL 0 OR missing OR NOT dampening EQUAL 0.25)
  message(FATAL_ERROR "--dampening 0.25 --json: expected \"dampening\": 0.25, got ${rc}: ${out} ${err}")
endif()

execute_process(COMMAND ${CLI} run --model ${LAYOUT} --backend cpu --optimizer sgd_momentum --steps 4 --resume ${ckpt}
                        --dampening 0.5
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--dampening 0.5 \\(checkpoint: 0.3\\)")
  message(FATAL_ERROR "--dampening 0.5 on the resume of a 0.3 checkpoint: expected exit 2 naming it, got ${rc}: ${err}")
endif()

foreach(refused "sgd_nesterov|Nesterov momentum requires a momentum and zero dampening"
                "adamw|--dampening: --optimizer adamw does not read it \\(the kinds that do: sgd_momentum, sgd_nesterov\\)")
  string(REPLACE "|" ";" parts "${refused}")
  list(GET parts 0 kind)
  list(GET parts 1 says)
  execute_process(COMMAND ${CLI} run --model ${LAYOUT} --backend cpu --optimizer ${kind} --steps 1 --dampening 0.1
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "${says}")
    message(FATAL_ERROR "--optimizer ${kind} --dampening 0.1: expected exit 2 with '${says}', got ${rc}: ${err}")
  endif()
endforeach()
