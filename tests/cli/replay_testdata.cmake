# ctest helper (cmake -P): the repository's replay cases through `renaissance replay` on the CPU.
#   cmake -DCLI=<renaissance> -DCASES=<testdata/replay> -DMODE=all "-DKINDS=a;b" -P replay_testdata.cmake
#     replays every case folder under CASES (each within its case.json tolerance, else 1e-6); each
#     must PASS with exit 0, and there must be at
#     least one per kind of KINDS, the kind table's names (a folder that lost its cases must not
#     pass by replaying none).
#   cmake -DCLI=... -DCASES=... -DMODE=perturbed -DWORK=<scratch dir> -P replay_testdata.cmake
#     copies sgd_momentum_decoupled and puts sgd_momentum_l2's expected file in it (same tensors,
#     weight decay applied the other way): the replay must fail with exit 1, so the comparison
#     really tells a wrong reference from a right one.
# `renaissance replay DIR --backend cpu` must exit `want` with stdout matching `says`; `what`
# starts the failure message.
function(expect_replay dir want says what)
  execute_process(COMMAND "${CLI}" replay "${dir}" --backend cpu RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  message("${out}${err}")
  if(NOT rc EQUAL want OR NOT out MATCHES "${says}")
    message(FATAL_ERROR "${what}: expected exit ${want} and ${says}, got exit ${rc}")
  endif()
endfunction()

if(MODE STREQUAL "all")
  file(GLOB entries LIST_DIRECTORIES true "${CASES}/*")
  set(count 0)
  set(kinds "")
  foreach(dir IN LISTS entries)
    if(NOT IS_DIRECTORY "${dir}")
      continue()
    endif()
    expect_replay("${dir}" 0 "PASS" "${dir}")
    file(READ "${dir}/case.json" text)
    string(JSON kind GET "${text}" optimizer kind)
    list(APPEND kinds ${kind})
    math(EXPR count "${count} + 1")
  endforeach()
  list(REMOVE_DUPLICATES kinds)
  if(NOT KINDS)
    message(FATAL_ERROR "no kinds given (-DKINDS=...)")
  endif()
  foreach(kind IN LISTS KINDS)  # every kind of the kind table needs a case
    list(FIND kinds "${kind}" found)
    if(found EQUAL -1)
      message(FATAL_ERROR "no case of kind ${kind} among the ${count} cases under ${CASES} (kinds: ${kinds})")
    endif()
  endforeach()
  message("${count} cases, kinds: ${kinds}: all PASS")
elseif(MODE STREQUAL "perturbed")
  file(REMOVE_RECURSE "${WORK}")
  file(MAKE_DIRECTORY "${WORK}")
  foreach(f case.json init.safetensors grads.safetensors)
    file(COPY "${CASES}/sgd_momentum_decoupled/${f}" DESTINATION "${WORK}")
  endforeach()
  file(COPY "${CASES}/sgd_momentum_l2/expected.safetensors" DESTINATION "${WORK}")
  expect_replay("${WORK}" 1 "ABOVE TOLERANCE" "a case with the wrong expected file")
else()
  message(FATAL_ERROR "MODE must be all or perturbed")
endif()
