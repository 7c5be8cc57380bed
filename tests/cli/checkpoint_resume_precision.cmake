# ctest helper (cmake -P): `renaissance run --precision bf16|fp16 [--stochastic-rounding]` with
# --checkpoint / --resume: 9 steps saved, then resumed up to 20, gives the fingerprint
# (master, model copy, M, V, t) of 20 uninterrupted steps, NaN steps on both sides of the save; a
# resume that runs no step (--steps 9) gives the saved fingerprint (an applied step rewrites the
# whole copy, so only this shows that the loaded copy is the saved one). A resume takes the
# precision, rounding and rounding seed from the checkpoint (no flags repeated, and --seed
# --override changes the gradients, not the copy's key); one whose --precision or
# --stochastic-rounding differs from the checkpoint's is refused with exit 2 naming both. --json's
# bytes_per_param counts the copy's 2-byte write.
# Input: CLI, LAYOUT, WORK (a scratch folder).
include(${CMAKE_CURRENT_LIST_DIR}/run_fingerprint.cmake)

function(expect_refused needle)
  execute_process(COMMAND ${CLI} run --model ${LAYOUT} --backend cpu ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "${needle}")
    message(FATAL_ERROR "renaissance run ${ARGN}: expected exit 2 saying '${needle}', got ${rc}: ${err}")
  endif()
endfunction()

file(MAKE_DIRECTORY ${WORK})
set(ckpt ${WORK}/run.ckpt)
run_fp(fp32 --optimizer adamw --steps 20 --nan-at 3,12)
foreach(cell "adamw:bf16:nearest" "adamw:fp16:stochastic" "lamb:bf16:stochastic" "sgd_nesterov:fp16:nearest")
  precision_cell("${cell}" kind precision pflags)
  file(REMOVE ${ckpt})
  run_fp(whole --optimizer ${kind} --steps 20 --nan-at 3,12 --seed 11 ${pflags})
  run_fp(first --optimizer ${kind} --steps 9 --nan-at 3 --seed 11 ${pflags}
         --checkpoint ${ckpt} --checkpoint-every 4)
  run_fp(loaded --steps 9 ${pflags} --resume ${ckpt})
  if(NOT loaded STREQUAL first)
    message(FATAL_ERROR "${kind} ${pflags}: the loaded state differs from the saved one (${loaded} vs ${first})")
  endif()
  run_fp(resumed --steps 20 --nan-at 3,12 ${pflags} --resume ${ckpt})
  message("${kind} ${pflags}: 20 steps ${whole}; 9 + resumed 11 ${resumed}")
  if(NOT resumed STREQUAL whole)
    message(FATAL_ERROR "${kind} ${pflags}: resuming changed the result (${resumed} vs ${whole})")
  endif()
  # The same resume without repeating the precision flags: the checkpoint supplies them.
  run_fp(bare --steps 20 --nan-at 3,12 --resume ${ckpt})
  if(NOT bare STREQUAL whole)
    message(FATAL_ERROR "${kind} ${pflags}: a resume without --precision did not continue the copy (${bare} vs ${whole})")
  endif()
  if(whole STREQUAL fp32 AND kind STREQUAL "adamw")
    message(FATAL_ERROR "${kind} ${precision}: the fingerprint does not cover the model copy (same as fp32)")
  endif()
endforeach()

# The last checkpoint is sgd_nesterov with an fp16 copy rounded to nearest.
expect_refused("--precision bf16 \\(checkpoint: fp16\\)" --steps 20 --precision bf16 --resume ${ckpt})
expect_refused("--precision fp32 \\(checkpoint: fp16\\)" --steps 20 --precision fp32 --resume ${ckpt})
expect_refused("--stochastic-rounding on \\(checkpoint: off\\)"
               --steps 20 --precision fp16 --stochastic-rounding --resume ${ckpt})

# The stochastic key's seed comes from the checkpoint: a --seed override changes the gradients
# only, so the resumed copy is rounded with the saved key (the load would refuse another one).
file(REMOVE ${ckpt})
run_fp(first --optimizer adamw --steps 4 --seed 5 --precision bf16 --stochastic-rounding --checkpoint ${ckpt})
run_fp(overridden --steps 6 --seed 6 --override seed --resume ${ckpt})

# bytes_per_param in --json: adamw moves 28 B/param (read g, w, m, v; write w, m, v), the check
# reads G once more (4), the copy writes 2.
function(expect_bytes want)
  execute_process(COMMAND ${CLI} run --model ${LAYOUT} --backend cpu --json --optimizer adamw --steps 1 ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(JSON got GET "${out}" bytes_per_param)
  if(NOT rc EQUAL 0 OR NOT got EQUAL want)
    message(FATAL_ERROR "renaissance run ${ARGN}: bytes_per_param ${got}, expected ${want} (${rc}: ${err})")
  endif()
endfunction()
expect_bytes(32)
expect_bytes(34 --precision bf16)
expect_bytes(34 --precision fp16 --stochastic-rounding)
expect_bytes(30 --precision bf16 --no-check-finite)
