# ctest helper (cmake -P): `renaissance run --precision bf16|fp16 --grad-dtype model` (gradients
# in the model dtype). The synthetic gradients are rounded to nearest even into the
# model dtype, so the run differs from --grad-dtype fp32 (else the option did nothing); 9 steps
# saved then resumed up to 20 with --grad-dtype model give the uninterrupted 20 steps (G is not
# in a checkpoint); --grad-dtype model without bf16/fp16 is refused (exit 2); --json's
# bytes_per_param counts 2 B per read of G: adamw bf16 28 + 2 for the check, lars (two reads of
# G: 28 - 4 + 2 for the copy = 26) 26 + 2 for the check, grad_dtype names the dtype.
# Input: CLI, LAYOUT, WORK (a scratch folder).
include(${CMAKE_CURRENT_LIST_DIR}/run_fingerprint.cmake)

file(MAKE_DIRECTORY ${WORK})
set(ckpt ${WORK}/run.ckpt)
foreach(cell "adamw:bf16:nearest" "lamb:fp16:stochastic" "lars:fp16:nearest" "sgd_momentum:bf16:stochastic")
  precision_cell("${cell}" kind precision pflags)
  run_fp(fp32_grads --optimizer ${kind} --steps 20 --nan-at 3,12 ${pflags})
  run_fp(whole --optimizer ${kind} --steps 20 --nan-at 3,12 ${pflags} --grad-dtype model)
  if(whole STREQUAL fp32_grads)
    message(FATAL_ERROR "${kind} ${precision}: --grad-dtype model gave the fp32-gradient fingerprint ${whole}")
  endif()
  file(REMOVE ${ckpt})
  run_fp(first --optimizer ${kind} --steps 9 --nan-at 3 ${pflags} --grad-dtype model
         --checkpoint ${ckpt})
  run_fp(resumed --steps 20 --nan-at 3,12 --grad-dtype model --resume ${ckpt})
  message("${kind} ${pflags}: fp32 gradients ${fp32_grads}, model-dtype ${whole}, 9 + resumed 11 ${resumed}")
  if(NOT resumed STREQUAL whole)
    message(FATAL_ERROR "${kind} ${precision}: resuming with model-dtype gradients changed the result (${resumed} vs ${whole})")
  endif()
endforeach()

execute_process(COMMAND ${CLI} run --model ${LAYOUT} --backend cpu --steps 1 --grad-dtype model
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--grad-dtype model needs --precision bf16 or fp16")
  message(FATAL_ERROR "--grad-dtype model with fp32: expected exit 2 and the reason, got ${rc}: ${err}")
endif()

function(expect_bytes want dtype kind)
  execute_process(COMMAND ${CLI} run --model ${LAYOUT} --backend cpu --json --optimizer ${kind} --steps 1 ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(JSON got GET "${out}" bytes_per_param)
  string(JSON got_dtype GET "${out}" grad_dtype)
  if(NOT rc EQUAL 0 OR NOT got EQUAL want OR NOT got_dtype STREQUAL dtype)
    message(FATAL_ERROR "run --optimizer ${kind} ${ARGN}: bytes_per_param ${got} grad_dtype ${got_dtype}, expected ${want} ${dtype} (${rc}: ${err})")
  endif()
endfunction()
expect_bytes(34 fp32 adamw --precision bf16)
expect_bytes(30 bf16 adamw --precision bf16 --grad-dtype model)
expect_bytes(28 fp16 adamw --precision fp16 --grad-dtype model --no-check-finite)
expect_bytes(26 fp16 lars --precision fp16 --grad-dtype model --no-check-finite)
expect_bytes(28 bf16 lars --precision bf16 --grad-dtype model)
