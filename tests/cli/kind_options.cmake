# ctest helper (cmake -P): `renaissance run` refuses, with exit 2 and a message naming the option
# and the kinds that take it, every hyperparameter option its --optimizer does not read (Muon's
# own with another kind, another kind's with Muon, ...), at any value, the kind's default
# included; the same options with a kind that reads them run. Input: CLI, LAYOUT, WORK.
file(MAKE_DIRECTORY ${WORK})
# kind|option[|value]|the kinds named in the message
set(refused
    "adamw|--aux-lr|0.01|muon"
    "adamw|--aux-lr|0.0003|muon"
    "sgd_momentum|--aux-weight-decay|0.1|muon"
    "lion|--ns-steps|3|muon"
    "lamb|--ns-eps|1e-6|muon"
    "adam|--adjust-lr|match_rms_adamw|muon"
    "adam|--adjust-lr|original|muon"
    "sgd|--muon-mode|fast|muon"
    "lars|--ns-a|3.0|muon"
    "adamw|--ns-b|-4.0|muon"
    "adamw|--ns-c|2.0|muon"
    "adamw|--no-nesterov|muon|--nesterov/--no-nesterov"
    "adamw|--nesterov|muon|--nesterov/--no-nesterov"
    "adamw|--momentum|0.5|sgd_momentum, sgd_nesterov, lars, lars_nesterov, muon"
    "sgd|--momentum|0.9|sgd_momentum, sgd_nesterov, lars, lars_nesterov, muon"
    "sgd|--dampening|0.5|sgd_momentum, sgd_nesterov"
    "sgd|--beta1|0.5|adam, adamw, lion, lamb, muon"
    "lion|--eps|1e-3|adam, adamw, lars, lars_nesterov, lamb, muon"
    "muon|--trust-coefficient|0.5|lars, lars_nesterov"
    "muon|--dampening|0.5|sgd_momentum, sgd_nesterov"
    "muon|--amsgrad|adam, adamw")
foreach(entry IN LISTS refused)
  string(REPLACE "|" ";" case "${entry}")
  list(LENGTH case n)
  list(GET case 0 kind)
  list(GET case 1 flag)
  if(flag MATCHES "nesterov")  # a flag on by default: the message names both spellings
    list(GET case 2 kinds)
    list(GET case 3 named)
    set(args ${flag})
  elseif(n EQUAL 4)
    list(GET case 2 value)
    list(GET case 3 kinds)
    set(args ${flag} ${value})
    set(named ${flag})
  else()
    list(GET case 2 kinds)
    set(args ${flag})
    set(named ${flag})
  endif()
  execute_process(COMMAND ${CLI} run --model ${LAYOUT} --backend cpu --threads 1 --steps 1 --optimizer ${kind} ${args}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(expected "${named}: --optimizer ${kind} does not read it (the kinds that do: ${kinds})")
  string(FIND "${err}" "${expected}" at)
  if(NOT rc EQUAL 2 OR at EQUAL -1)
    message(FATAL_ERROR "--optimizer ${kind} ${args}: expected exit 2 with '${expected}', got ${rc}: ${err}${out}")
  endif()
endforeach()

# The same options with a kind that reads them run.
foreach(entry "muon|--aux-lr|0.01" "muon|--adjust-lr|match_rms_adamw" "muon|--no-nesterov" "sgd_momentum|--momentum|0.5"
              "lars|--trust-coefficient|0.5" "adamw|--amsgrad" "sgd_momentum|--dampening|0.5" "muon|--beta1|0.8")
  string(REPLACE "|" ";" ok "${entry}")
  list(POP_FRONT ok kind)
  execute_process(COMMAND ${CLI} run --model ${LAYOUT} --backend cpu --threads 1 --steps 1 --optimizer ${kind} ${ok}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "--optimizer ${kind} ${ok}: expected exit 0, got ${rc}: ${err}")
  endif()
endforeach()

# A resume refuses them too (the kind is the checkpoint's).
set(ckpt ${WORK}/adamw.ckpt)
file(REMOVE ${ckpt})
execute_process(COMMAND ${CLI} run --model ${LAYOUT} --backend cpu --threads 1 --steps 1 --optimizer adamw --checkpoint ${ckpt}
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "adamw --checkpoint: exit ${rc}: ${err}")
endif()
execute_process(COMMAND ${CLI} run --model ${LAYOUT} --backend cpu --threads 1 --steps 2 --resume ${ckpt}
                        --aux-lr 0.01 --override aux-lr
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--aux-lr: --optimizer adamw does not read it \\(the kinds that do: muon\\)")
  message(FATAL_ERROR "--resume adamw --aux-lr: expected exit 2 naming --aux-lr, got ${rc}: ${err}${out}")
endif()
list(LENGTH refused count)
message("kind options: ${count} refused, 8 run, the resume refused")
