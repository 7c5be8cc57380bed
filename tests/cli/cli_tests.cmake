# End-to-end ctest entries for the `renaissance` tool: every subcommand, the exit-code and
# one-line-error contract, the fingerprint contract, and the repository's replay cases.
set(RN_CLI $<TARGET_FILE:renaissance_cli>)
set(RN_EXPECT ${CMAKE_COMMAND} -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake --)
set(RN_TESTDATA_DIR ${CMAKE_SOURCE_DIR}/testdata)
set(RN_TINY ${CMAKE_CURRENT_LIST_DIR}/tiny_layout.json)
set(RN_CASE ${RN_TESTDATA_DIR}/replay/adamw)
set(RN_TEST_OUT ${CMAKE_CURRENT_BINARY_DIR}/test-out)
file(MAKE_DIRECTORY ${RN_TEST_OUT})

macro(rn_cli_test name rc)
  add_test(NAME ${name} COMMAND ${CMAKE_COMMAND} -DRC=${rc} ${ARGN})
  set_tests_properties(${name} PROPERTIES LABELS cli TIMEOUT 120)
endmacro()

# Help of the tool and of each subcommand.
foreach(sub "" run replay audit layouts)
  string(REPLACE ";" "" tag "cli_help_${sub}")
  rn_cli_test(${tag} 0 "-DMATCH=Usage:" -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- ${RN_CLI} ${sub} --help)
endforeach()

# layouts: the five embedded layouts with their counts (docs/design.md).
rn_cli_test(cli_layouts 0 "-DMATCH=resnet50 +161 +25557032" -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- ${RN_CLI} layouts)

# run: the default model and optimizer (short), a layout file, --json, every kind.
rn_cli_test(cli_run_resnet50 0 "-DMATCH=fingerprint +[0-9a-f]+"
            -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- ${RN_CLI} run --steps 2)
rn_cli_test(cli_run_json 0 "-DMATCH=\"fingerprint\":\"[0-9a-f]+\""
            -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- ${RN_CLI} run --model ${RN_TINY} --steps 5 --nan-at 2 --json)
foreach(kind ${RN_KIND_NAMES})
  rn_cli_test(cli_run_${kind} 0 "-DMATCH=applied"
              -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- ${RN_CLI} run --model ${RN_TINY} --optimizer ${kind}
              --steps 6 --schedule cosine --warmup 2 --loss-scale 256 --nan-at 1)
endforeach()
add_test(NAME cli_run_fingerprints
         COMMAND ${CMAKE_COMMAND} -DCLI=${RN_CLI} -DLAYOUT=${RN_TINY} "-DKINDS=${RN_KIND_NAMES}"
                 -DWORK=${CMAKE_CURRENT_BINARY_DIR}/fingerprints -P ${CMAKE_CURRENT_LIST_DIR}/fingerprints.cmake)
set_tests_properties(cli_run_fingerprints PROPERTIES LABELS cli TIMEOUT 120)
# Script tests on the tiny layout: tests/cli/NAME.cmake is the entry cli_run_NAME, in a folder of its own.
foreach(script checkpoint_resume checkpoint_resume_precision maximize dampening grad_dtype muon_options
               kind_options)
  add_test(NAME cli_run_${script}
           COMMAND ${CMAKE_COMMAND} -DCLI=${RN_CLI} -DLAYOUT=${RN_TINY} -DWORK=${CMAKE_CURRENT_BINARY_DIR}/${script}
                   -P ${CMAKE_CURRENT_LIST_DIR}/${script}.cmake)
  set_tests_properties(cli_run_${script} PROPERTIES LABELS cli TIMEOUT 120)
endforeach()

# kinds --json: the kind table's torch_m column for every kind.
add_test(NAME cli_kinds_json COMMAND ${CMAKE_COMMAND} -DCLI=${RN_CLI} -P ${CMAKE_CURRENT_LIST_DIR}/kinds_json.cmake)
set_tests_properties(cli_kinds_json PROPERTIES LABELS cli TIMEOUT 120)

# audit: every kind, every available backend, all agree.
rn_cli_test(cli_audit 0 "-DMATCH=all backends agree" -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- ${RN_CLI} audit --steps 4)
# The audit runs ~300 short CPU tasks (its mixed-precision table), each step a few OpenMP
# regions: with libgomp's default spinning, a loaded 2-core machine (ctest --parallel) turns the
# 1-3 s audit into a minute. Passive waiting changes no bit (the thread count does not either).
set_tests_properties(cli_audit PROPERTIES ENVIRONMENT OMP_WAIT_POLICY=passive)

# replay: a passing case with --out, and a tolerance no float32 run meets (exit 1, still writes).
rn_cli_test(cli_replay 0 "-DMATCH=PASS" -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake --
            ${RN_CLI} replay ${RN_CASE} --backend cpu --out ${RN_TEST_OUT}/replay.safetensors)
rn_cli_test(cli_replay_above_tolerance 1 "-DMATCH=ABOVE TOLERANCE" -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake --
            ${RN_CLI} replay ${RN_CASE} --tolerance 1e-12)
# A case's own tolerance (case.json) is used without --tolerance, and --tolerance overrides it.
rn_cli_test(cli_replay_case_tolerance 0 "-DMATCH=tolerance 3\\.0e-04: PASS" -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake --
            ${RN_CLI} replay ${RN_TESTDATA_DIR}/replay/muon --backend cpu)
rn_cli_test(cli_replay_case_tolerance_overridden 1 "-DMATCH=tolerance 1\\.0e-06: FAIL" -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake --
            ${RN_CLI} replay ${RN_TESTDATA_DIR}/replay/muon --backend cpu --tolerance 1e-6)
# Every case of testdata/replay (each kind and weight-decay mode, references not computed by the
# library) passes on the CPU; a case with a wrong expected file fails with exit 1.
add_test(NAME cli_replay_testdata
         COMMAND ${CMAKE_COMMAND} -DCLI=${RN_CLI} -DCASES=${RN_TESTDATA_DIR}/replay -DMODE=all "-DKINDS=${RN_KIND_NAMES}"
                 -P ${CMAKE_CURRENT_LIST_DIR}/replay_testdata.cmake)
add_test(NAME cli_replay_testdata_perturbed
         COMMAND ${CMAKE_COMMAND} -DCLI=${RN_CLI} -DCASES=${RN_TESTDATA_DIR}/replay -DMODE=perturbed
                 -DWORK=${CMAKE_CURRENT_BINARY_DIR}/replay_perturbed -P ${CMAKE_CURRENT_LIST_DIR}/replay_testdata.cmake)
set_tests_properties(cli_replay_testdata cli_replay_testdata_perturbed PROPERTIES LABELS cli TIMEOUT 300)
# Format 2: the cases renaissance.torch.Recorder recorded reach their expected fingerprint bit
# for bit, and a wrong expected fingerprint fails (exit 1).
add_test(NAME cli_replay_recorded
         COMMAND ${CMAKE_COMMAND} -DCLI=${RN_CLI} -DCASES=${RN_TESTDATA_DIR}/recorded
                 -DWORK=${CMAKE_CURRENT_BINARY_DIR}/replay_recorded -P ${CMAKE_CURRENT_LIST_DIR}/replay_recorded.cmake)
set_tests_properties(cli_replay_recorded PROPERTIES LABELS cli TIMEOUT 120)

# Usage and input errors: exit 2, one line on stderr naming the option or file, no output file.
set(rn_bad_usage
    "no_subcommand|subcommand"
    "run_unknown_option|--bogus|run^--bogus"
    "run_bad_steps|--steps|run^--steps^abc"
    "run_zero_steps|--steps 0|run^--steps^0"
    "run_unknown_kind|adamax|run^--optimizer^adamax"
    "run_negative_lr|lr|run^--lr=-1"
    "run_beta1_one|beta1|run^--beta1^1"
    "run_unknown_model|nosuch|run^--model^nosuch"
    "run_missing_layout_file|nosuch.json|run^--model^/nonexistent/nosuch.json"
    "run_nan_at_out_of_range|--nan-at 99|run^--steps^3^--nan-at^99"
    "run_bad_schedule|--schedule|run^--schedule^linear"
    "run_zero_loss_scale|loss scale|run^--loss-scale^0"
    "replay_missing_dir|case.json|replay^/nonexistent/case"
    "replay_bad_out_folder|--out|replay^${RN_CASE}^--out^/nonexistent/dir/out.safetensors")
foreach(entry IN LISTS rn_bad_usage)
  # Fields are separated by |, arguments by ^ (a ; would split the list itself).
  string(REPLACE "^" "|" entry "${entry}")
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 0 tag)
  list(GET parts 1 words)
  list(LENGTH parts n)
  set(args "")
  if(n GREATER 2)
    list(SUBLIST parts 2 -1 args)
  endif()
  rn_cli_test(cli_usage_${tag} 2 "-DMATCH=${words}" -DONE_LINE_ERROR=1 -DNO_FILE=${RN_TEST_OUT}/never.safetensors
              -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- ${RN_CLI} ${args})
endforeach()
if(NOT RENAISSANCE_WITH_CUDA)
  rn_cli_test(cli_usage_cuda_unavailable 2 "-DMATCH=--backend cuda" -DONE_LINE_ERROR=1
              -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- ${RN_CLI} run --backend cuda --steps 1)
endif()

# The committed cases are what scripts/make_testdata.py writes: regenerate them (numpy only, no
# torch) and compare byte for byte. numpy is a declared dependency (scripts/install-deps.sh): a
# missing one makes this test fail rather than disappear. RN_PYTHON_WITH_NUMPY: the interpreter
# tests/CMakeLists.txt found.
if(RN_PYTHON_WITH_NUMPY)
  add_test(NAME replay_testdata_regenerates
           COMMAND ${RN_PYTHON_WITH_NUMPY} ${CMAKE_SOURCE_DIR}/scripts/make_testdata.py --check --out ${RN_TESTDATA_DIR}/replay)
else()
  message(WARNING "no python3 with numpy found (scripts/install-deps.sh installs it): replay_testdata_regenerates will fail")
  add_test(NAME replay_testdata_regenerates COMMAND ${CMAKE_COMMAND} -E false)
endif()
set_tests_properties(replay_testdata_regenerates PROPERTIES LABELS cli TIMEOUT 120)

# An empty value is refused by every option that takes one (it ran as 0 or "off" for --lr,
# --max-grad-norm, ..., as step 0 for --nan-at, and was ignored by --distributed, --grad-reduce,
# --override, --weight-decay-mode): exit 2, one error line naming the option, nothing run or
# written (empty_value.cmake). One test per option (`--opt ""`), then per subcommand one over
# every option its --help lists (so an option added later is covered without a new line here)
# and one over every option spelled `--opt=` (it took the next argument as its value; flags
# read it as on); last, a list with an empty item (--nan-at dropped it).
set(rn_empty_run_options
    model optimizer lr weight-decay momentum beta1 beta2 eps trust-coefficient max-grad-norm weight-decay-mode
    steps schedule-steps backend threads schedule warmup loss-scale nan-at seed checkpoint checkpoint-every resume
    override precision grad-dtype distributed grad-reduce simulate-ranks)
function(rn_empty_value_test sub opt)
  set(no_file ${RN_TEST_OUT}/empty_value_${sub}_${opt})  # the output the command must not write
  if(sub STREQUAL "run")
    set(args --model ${RN_TINY} --steps 1 --threads 1 --checkpoint ${no_file})
  elseif(sub STREQUAL "replay")
    set(args ${RN_CASE} --backend cpu --threads 1 --out ${no_file})
  else()
    set(args "")
  endif()
  add_test(NAME cli_empty_value_${sub}_${opt}
           COMMAND ${CMAKE_COMMAND} -DCLI=${RN_CLI} -DSUB=${sub} ${ARGN} "-DARGS=${args}" -DNO_FILE=${no_file}
                   -P ${CMAKE_CURRENT_LIST_DIR}/empty_value.cmake)
  set_tests_properties(cli_empty_value_${sub}_${opt} PROPERTIES LABELS cli TIMEOUT 120)
endfunction()
foreach(sub run replay audit)
  if(sub STREQUAL "run")
    set(opts ${rn_empty_run_options})
  elseif(sub STREQUAL "replay")
    set(opts backend threads out tolerance)
  else()
    set(opts steps)
  endif()
  foreach(opt IN LISTS opts)
    rn_empty_value_test(${sub} ${opt} -DOPT=--${opt})
  endforeach()
  rn_empty_value_test(${sub} every_option)
  rn_empty_value_test(${sub} every_option_inline -DFORM=inline)
endforeach()
foreach(item "leading|,0" "trailing|0," "double|0,,0")
  string(REPLACE "|" ";" item "${item}")
  list(GET item 0 tag)
  list(GET item 1 value)
  rn_empty_value_test(run nan-at_item_${tag} -DOPT=--nan-at "-DVALUE=${value}" "-DMESSAGE=an empty item in")
endforeach()
