# ctest helper (cmake -P): `renaissance kinds --json` lists each kind's torch_m column (what torch
# calls the kind's M) next to the other columns. The expected values are torch's, written out
# here: torch.optim.SGD and Muon keep a momentum_buffer, Adam and AdamW an exp_avg (LARS follows
# SGD, Lion and LAMB follow Adam), and MuonWithAuxAdam's weight group is Muon's while its
# bias-like group is its AdamW's. Input: CLI.
execute_process(COMMAND ${CLI} kinds --json RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "kinds --json: exit ${rc}: ${out} ${err}")
endif()
set(expected sgd=momentum_buffer sgd_momentum=momentum_buffer sgd_nesterov=momentum_buffer adam=exp_avg
             adamw=exp_avg lars=momentum_buffer lars_nesterov=momentum_buffer lion=exp_avg lamb=exp_avg
             muon=momentum_buffer_in_weight_group)
string(JSON count LENGTH "${out}")
list(LENGTH expected want)
if(NOT count EQUAL want)
  message(FATAL_ERROR "kinds --json: ${count} kinds, expected ${want}: ${out}")
endif()
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
  list(GET expected ${i} pair)
  string(REPLACE "=" ";" pair "${pair}")
  list(GET pair 0 kind)
  list(GET pair 1 torch_m)
  string(JSON name GET "${out}" ${i} name)
  string(JSON got ERROR_VARIABLE missing GET "${out}" ${i} torch_m)
  if(NOT name STREQUAL kind OR missing OR NOT got STREQUAL torch_m)
    message(FATAL_ERROR "kinds --json: entry ${i} (${name}): expected ${kind} with torch_m ${torch_m}, got "
                        "torch_m '${got}' ${missing}")
  endif()
endforeach()
message("kinds --json: torch_m of ${count} kinds as expected")
