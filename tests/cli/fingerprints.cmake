# ctest helper (cmake -P): the fingerprint contract of `renaissance run`: the same with
# --threads 1 and --threads 2, different when the seed or any hyperparameter changes, and NaN
# steps counted as skipped. Input: CLI, LAYOUT (a small layout file), WORK (a folder of this test's
# own: several registrations of this script run in parallel, so no file may be shared).
function(run_json out_var)
  execute_process(COMMAND ${CLI} run --model ${LAYOUT} --steps 4 --backend cpu --json ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "renaissance run ${ARGN} failed (${rc}): ${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()
function(fingerprint out_var)
  run_json(json ${ARGN})
  string(JSON fp GET "${json}" fingerprint)
  set(${out_var} "${fp}" PARENT_SCOPE)
endfunction()

foreach(kind sgd sgd_momentum adamw lars)
  fingerprint(one --optimizer ${kind} --threads 1)
  fingerprint(two --optimizer ${kind} --threads 2)
  message("${kind}: threads 1 -> ${one}, threads 2 -> ${two}")
  if(NOT one STREQUAL two)
    message(FATAL_ERROR "${kind}: fingerprint depends on the thread count")
  endif()
endforeach()

fingerprint(base --optimizer adamw)
foreach(change "--seed;1" "--lr;0.002" "--weight-decay;0.02" "--beta1;0.8" "--beta2;0.99" "--eps;1e-6"
               "--schedule;cosine" "--warmup;2" "--steps;5")
  fingerprint(other --optimizer adamw ${change})
  message("adamw ${change}: ${other} (base ${base})")
  if(other STREQUAL base)
    message(FATAL_ERROR "fingerprint did not change with ${change}")
  endif()
endforeach()
foreach(change "--momentum;0.8" "--trust-coefficient;0.01")
  fingerprint(lbase --optimizer lars)
  fingerprint(other --optimizer lars ${change})
  if(other STREQUAL lbase)
    message(FATAL_ERROR "lars fingerprint did not change with ${change}")
  endif()
endforeach()

# A power-of-two loss scale multiplies and divides exactly, so it must not change a single bit.
fingerprint(scaled --optimizer adamw --loss-scale 1024)
if(NOT scaled STREQUAL base)
  message(FATAL_ERROR "--loss-scale 1024 changed the fingerprint (${scaled} vs ${base}): the unscale is not exact")
endif()

run_json(json --optimizer adamw --nan-at 1,3)
string(JSON applied GET "${json}" steps_applied)
string(JSON skipped GET "${json}" steps_skipped)
if(NOT applied EQUAL 2 OR NOT skipped EQUAL 2)
  message(FATAL_ERROR "--nan-at 1,3 over 4 steps: expected 2 applied and 2 skipped, got ${applied} and ${skipped}")
endif()
foreach(key model optimizer backend threads steps_applied steps_skipped ms_per_step gb_per_s limit_gb_per_s share_of_limit fingerprint)
  string(JSON value ERROR_VARIABLE missing GET "${json}" ${key})
  if(missing)
    message(FATAL_ERROR "--json output lacks key ${key}: ${json}")
  endif()
endforeach()
# `run` measures the same-traffic limit in place over the task's arena between steps;
# that must not change a bit: the audit cells' runs (audit/audit_cells.h: its layout, wd
# 0.01, seed 1, loss scale 1024, a NaN at step 2 of 4) must still give the golden fingerprints,
# which `renaissance audit` records without measuring anything.
file(READ "${CMAKE_CURRENT_LIST_DIR}/../../audit/golden/fingerprints.json" golden)
if(NOT WORK)
  message(FATAL_ERROR "no work folder given (-DWORK=...)")
endif()
file(MAKE_DIRECTORY "${WORK}")
set(audit_layout "${WORK}/audit_layout.json")
file(WRITE "${audit_layout}" "{\"name\": \"audit\", \"params\": [
{\"name\": \"conv1.weight\", \"shape\": [16, 3, 3, 3], \"role\": \"first_conv\"},
{\"name\": \"bn1.weight\", \"shape\": [16], \"role\": \"bn_weight\"},
{\"name\": \"bn1.bias\", \"shape\": [16], \"role\": \"bn_bias\"},
{\"name\": \"layer1.conv.weight\", \"shape\": [32, 16, 3, 3], \"role\": \"deep_conv\"},
{\"name\": \"layer1.bn.weight\", \"shape\": [32], \"role\": \"bn_weight\"},
{\"name\": \"layer1.bn.bias\", \"shape\": [32], \"role\": \"bn_bias\"},
{\"name\": \"layer2.conv.weight\", \"shape\": [64, 32, 3, 3], \"role\": \"deep_conv\"},
{\"name\": \"empty.weight\", \"shape\": [0, 8], \"role\": \"deep_conv\"},
{\"name\": \"fc.weight\", \"shape\": [10, 64], \"role\": \"fc_weight\"},
{\"name\": \"fc.bias\", \"shape\": [10], \"role\": \"fc_bias\"}]}
")
if(NOT KINDS)
  message(FATAL_ERROR "no kinds given (-DKINDS=...)")
endif()
foreach(kind IN LISTS KINDS)  # every kind of the kind table (CMake reads kinds.h)
  string(JSON want GET "${golden}" cells audit.${kind}.steps4 fingerprint)
  set(LAYOUT_SAVED ${LAYOUT})
  set(LAYOUT ${audit_layout})
  run_json(json --optimizer ${kind} --weight-decay 0.01 --nan-at 2 --seed 1 --loss-scale 1024)
  set(LAYOUT ${LAYOUT_SAVED})
  string(JSON got GET "${json}" fingerprint)
  string(JSON share GET "${json}" share_of_limit)
  message("${kind}: audit cell with the limit measured between steps -> ${got} (golden ${want}), share_of_limit ${share}")
  if(NOT got STREQUAL want)
    message(FATAL_ERROR "${kind}: measuring the same-traffic limit changed the state (${got}, golden ${want})")
  endif()
endforeach()

# The model copy: thread-independent, covered by the fingerprint (it differs from
# fp32's, between bf16 and fp16, between nearest and stochastic, and with the seed).
set(prints "")
foreach(p "--precision;bf16" "--precision;fp16" "--precision;bf16;--stochastic-rounding"
          "--precision;fp16;--stochastic-rounding" "--precision;bf16;--stochastic-rounding;--seed;7")
  fingerprint(one --optimizer adamw --nan-at 1 --threads 1 ${p})
  fingerprint(two --optimizer adamw --nan-at 1 --threads 2 ${p})
  message("adamw ${p}: threads 1 -> ${one}, threads 2 -> ${two}")
  if(NOT one STREQUAL two)
    message(FATAL_ERROR "adamw ${p}: fingerprint depends on the thread count")
  endif()
  list(APPEND prints ${one})
endforeach()
fingerprint(fp32 --optimizer adamw --nan-at 1)
list(APPEND prints ${fp32})
list(LENGTH prints n)
list(REMOVE_DUPLICATES prints)
list(LENGTH prints distinct)
if(NOT n EQUAL distinct)
  message(FATAL_ERROR "two precision settings gave the same fingerprint: ${prints}")
endif()

message("fingerprint contract holds")
