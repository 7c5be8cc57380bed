# ctest helper (cmake -P): `renaissance run --optimizer muon` on the tiny layout (conv weights as
# matrices, a zero-size weight, every bias-like role). Each of Muon's options (--no-nesterov,
# --adjust-lr match_rms_adamw, --ns-steps, --aux-lr, the coefficients) changes the run and gives
# the same bits on 1 and 2 threads; a 6-step run saved after 3 and resumed gives the fingerprint
# of 6 uninterrupted steps (the resume inherits Muon's options); --simulate-ranks 1 is the plain
# run and 2 another; a bad --adjust-lr and --ns-steps 0 are refused with exit 2 naming them.
# Input: CLI, LAYOUT, WORK.
include(${CMAKE_CURRENT_LIST_DIR}/run_fingerprint.cmake)

file(MAKE_DIRECTORY ${WORK})
set(base --optimizer muon --steps 5 --loss-scale 8 --nan-at 2 --schedule cosine)
run_fp(plain ${base} --threads 1)
run_fp(plain2 ${base} --threads 2)
if(NOT plain STREQUAL plain2)
  message(FATAL_ERROR "muon: the fingerprint depends on the thread count (${plain} vs ${plain2})")
endif()
foreach(option "--no-nesterov" "--adjust-lr;match_rms_adamw" "--ns-steps;3" "--aux-lr;0.01" "--ns-a;3.0"
               "--momentum;0.9" "--weight-decay;0.3")
  run_fp(one ${base} ${option} --threads 1)
  run_fp(two ${base} ${option} --threads 2)
  expect_option_changes_run("muon ${option}" ${plain} ${one} ${two})
endforeach()

set(ckpt ${WORK}/muon.ckpt)
file(REMOVE ${ckpt})
run_fp(whole --optimizer muon --steps 6 --no-nesterov --adjust-lr match_rms_adamw --ns-steps 4)
run_fp(first --optimizer muon --steps 3 --no-nesterov --adjust-lr match_rms_adamw --ns-steps 4 --checkpoint ${ckpt})
run_fp(resumed --optimizer muon --steps 6 --resume ${ckpt})
if(NOT resumed STREQUAL whole)
  message(FATAL_ERROR "muon: 3 steps + resumed 3 (${resumed}) differ from 6 steps (${whole})")
endif()

# --simulate-ranks (the audit of an ordered sharded run): one rank is the plain run, two ranks'
# mean gradient is another run.
run_fp(sim1 ${base} --threads 1 --simulate-ranks 1)
run_fp(sim2 ${base} --threads 1 --simulate-ranks 2)
if(NOT sim1 STREQUAL plain OR sim2 STREQUAL plain)
  message(FATAL_ERROR "muon --simulate-ranks: 1 rank ${sim1} must equal the plain run ${plain}, 2 ranks ${sim2} not")
endif()

foreach(case "--adjust-lr;sqrt;--adjust-lr sqrt: expected one of original\\|match_rms_adamw"
             "--ns-steps;0;invalid ns_steps = 0")
  list(GET case 0 flag)
  list(GET case 1 value)
  list(GET case 2 pattern)
  execute_process(COMMAND ${CLI} run --model ${LAYOUT} --backend cpu --optimizer muon --steps 2 ${flag} ${value}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "${pattern}")
    message(FATAL_ERROR "muon ${flag} ${value}: expected exit 2 matching '${pattern}', got ${rc}: ${err}")
  endif()
endforeach()
message("muon: ${plain}, resumed ${resumed}")
