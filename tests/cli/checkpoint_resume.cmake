# ctest helper (cmake -P): `renaissance run --checkpoint/--resume`: 9 steps saved, then
# resumed up to 20, gives the fingerprint of 20 uninterrupted steps (NaN steps on both sides of
# the save), and a checkpoint of another optimizer is refused with exit 2 naming both kinds.
# Input: CLI, LAYOUT, WORK (a scratch folder).
include(${CMAKE_CURRENT_LIST_DIR}/run_fingerprint.cmake)

file(MAKE_DIRECTORY ${WORK})
set(ckpt ${WORK}/run.ckpt)
file(REMOVE ${ckpt})
foreach(kind adamw lars sgd_nesterov)
  run_fp(whole --optimizer ${kind} --steps 20 --nan-at 3,12)
  run_fp(first --optimizer ${kind} --steps 9 --nan-at 3 --checkpoint ${ckpt} --checkpoint-every 4)
  run_fp(resumed --optimizer ${kind} --steps 20 --nan-at 3,12 --resume ${ckpt})
  message("${kind}: 20 steps ${whole}; 9 + resumed 11 ${resumed}")
  if(NOT resumed STREQUAL whole)
    message(FATAL_ERROR "${kind}: resuming from a checkpoint changed the result (${resumed} vs ${whole})")
  endif()
endforeach()

execute_process(COMMAND ${CLI} run --model ${LAYOUT} --backend cpu --optimizer adam --steps 20 --resume ${ckpt}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "sgd_nesterov" OR NOT err MATCHES "adam")
  message(FATAL_ERROR "resuming an sgd_nesterov checkpoint as adam: expected exit 2 naming both, got ${rc}: ${err}")
endif()
