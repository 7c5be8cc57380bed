# ctest helper (cmake -P): `renaissance run --maximize`. A maximizing run is the same with
# --threads 1 and 2, differs from the minimizing run, reports "maximize": true in --json; a run
# of 6 steps saved after 3 and resumed (without the flag: the checkpoint carries it) gives the
# fingerprint of 6 uninterrupted maximizing steps; --maximize on the resume of a minimizing
# checkpoint is refused with exit 2 naming it. Input: CLI, LAYOUT, WORK (a scratch folder).
include(${CMAKE_CURRENT_LIST_DIR}/run_fingerprint.cmake)

file(MAKE_DIRECTORY ${WORK})
set(ckpt ${WORK}/run.ckpt)
foreach(kind sgd_momentum adam adamw lars lion lamb)
  run_fp(down --optimizer ${kind} --steps 6 --loss-scale 8)
  run_fp(up1 --optimizer ${kind} --steps 6 --loss-scale 8 --maximize --threads 1)
  run_fp(up2 --optimizer ${kind} --steps 6 --loss-scale 8 --maximize --threads 2)
  expect_option_changes_run("${kind} --maximize" ${down} ${up1} ${up2})
  file(REMOVE ${ckpt})
  run_fp(first --optimizer ${kind} --steps 3 --loss-scale 8 --maximize --checkpoint ${ckpt})
  run_fp(resumed --optimizer ${kind} --steps 6 --resume ${ckpt})
  message("${kind}: minimize ${down}, maximize ${up1}, 3 + resumed 3 ${resumed}")
  if(NOT resumed STREQUAL up1)
    message(FATAL_ERROR "${kind}: resuming a --maximize checkpoint did not continue the maximizing run "
                        "(${resumed} vs ${up1})")
  endif()
endforeach()

execute_process(COMMAND ${CLI} run --model ${LAYOUT} --backend cpu --steps 2 --maximize --json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(JSON maximize ERROR_VARIABLE missing GET "${out}" maximize)
if(NOT rc EQUAL 0 OR missing OR NOT maximize)
  message(FATAL_ERROR "--maximize --json: expected \"maximize\": true, got ${rc}: ${out} ${err}")
endif()

file(REMOVE ${ckpt})
run_fp(plain --optimizer adamw --steps 2 --checkpoint ${ckpt})
execute_process(COMMAND ${CLI} run --model ${LAYOUT} --backend cpu --optimizer adamw --steps 4 --resume ${ckpt}
                        --maximize
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--maximize on \\(checkpoint: off\\)")
  message(FATAL_ERROR "--maximize on the resume of a minimizing checkpoint: expected exit 2 naming it, got ${rc}: ${err}")
endif()
