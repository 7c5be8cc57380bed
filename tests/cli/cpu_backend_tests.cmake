# ctest entries for the CPU backend's performance work: the memory of `renaissance run`
# against its arena, and the backend's switches (RENAISSANCE_CPU_*, backend_cpu/cpu_ops.h) leaving
# every bit as it was. Label: cli.
find_package(Python3 COMPONENTS Interpreter QUIET)
# Not in a sanitizer build: ASan's shadow memory and quarantine add ~10 % of RSS that a user's
# build does not have (measured 1.154x there against 1.042x in Release), so the figure means nothing.
if(CMAKE_CXX_FLAGS MATCHES "-fsanitize")
  message(STATUS "sanitizer build: cli_run_memory (peak RSS vs arena) is not registered")
elseif(Python3_EXECUTABLE)
  add_test(NAME cli_run_memory COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/run_memory.py $<TARGET_FILE:renaissance_cli>)
  set_tests_properties(cli_run_memory PROPERTIES LABELS cli TIMEOUT 120)
else()
  message(WARNING "python3 not found: cli_run_memory is not registered")
endif()

# The fingerprint contract (fingerprints.cmake: threads 1 and 2 agree, the golden audit cells of
# every kind) under non-default switches: every schedule, small chunks so that the small layouts
# span many blocks, software prefetch far ahead, the old arena placement (memset, no huge pages).
# Name, then the variables separated by ^ (a ; would split the list itself).
set(rn_cpu_switches
    "small_static|RENAISSANCE_CPU_CHUNK=64^RENAISSANCE_CPU_SCHEDULE=static^RENAISSANCE_CPU_PREFETCH=100^RENAISSANCE_CPU_FIRST_TOUCH=0^RENAISSANCE_CPU_HUGEPAGES=0"
    "dynamic_prefetch|RENAISSANCE_CPU_CHUNK=1088^RENAISSANCE_CPU_SCHEDULE=dynamic^RENAISSANCE_CPU_PREFETCH=4096")
foreach(entry IN LISTS rn_cpu_switches)
  string(FIND "${entry}" "|" bar)
  string(SUBSTRING "${entry}" 0 ${bar} name)
  math(EXPR bar "${bar} + 1")
  string(SUBSTRING "${entry}" ${bar} -1 switches)
  string(REPLACE "^" ";" switches "${switches}")
  add_test(NAME cli_run_fingerprints_cpu_${name}
           COMMAND ${CMAKE_COMMAND} -DCLI=$<TARGET_FILE:renaissance_cli> -DLAYOUT=${CMAKE_CURRENT_LIST_DIR}/tiny_layout.json
                   "-DKINDS=${RN_KIND_NAMES}" -DWORK=${CMAKE_CURRENT_BINARY_DIR}/fingerprints_cpu_${name}
                   -P ${CMAKE_CURRENT_LIST_DIR}/fingerprints.cmake)
  set_tests_properties(cli_run_fingerprints_cpu_${name} PROPERTIES LABELS cli TIMEOUT 120 ENVIRONMENT "${switches}")
endforeach()

# The switches reach the backend through the program (tools/program_env.h: the library reads no
# environment): `renaissance run` names the non-default ones in its backend line, and a malformed
# value is refused with the variable named (exit 3, one error line), on the CPU only.
add_test(NAME cli_run_cpu_switches_reach_the_backend
         COMMAND ${CMAKE_COMMAND} -DRC=0 "-DMATCH=backend +cpu [(][^)]*, chunk 64, static, prefetch 100[)]"
                 -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake --
                 $<TARGET_FILE:renaissance_cli> run --model ${CMAKE_CURRENT_LIST_DIR}/tiny_layout.json --steps 2 --backend cpu)
set_tests_properties(cli_run_cpu_switches_reach_the_backend PROPERTIES LABELS cli TIMEOUT 120
                     ENVIRONMENT "RENAISSANCE_CPU_CHUNK=64;RENAISSANCE_CPU_SCHEDULE=static;RENAISSANCE_CPU_PREFETCH=100")
foreach(entry "chunk_text|RENAISSANCE_CPU_CHUNK=x|RENAISSANCE_CPU_CHUNK=x: expected a non-negative integer"
              "chunk_odd|RENAISSANCE_CPU_CHUNK=100|RENAISSANCE_CPU_CHUNK=100: expected a positive multiple of 64"
              "schedule|RENAISSANCE_CPU_SCHEDULE=guided|RENAISSANCE_CPU_SCHEDULE=guided: expected static or dynamic"
              "fuse|RENAISSANCE_CPU_FUSE=0|RENAISSANCE_CPU_FUSE=0: no longer a switch [(]unset it[)]"
              "unroll|RENAISSANCE_CPU_UNROLL=3|RENAISSANCE_CPU_UNROLL=3: no longer a switch [(]unset it[)]")
  string(REPLACE "|" ";" parts "${entry}")
  list(GET parts 0 tag)
  list(GET parts 1 variable)
  list(GET parts 2 says)
  add_test(NAME cli_run_cpu_switch_malformed_${tag}
           COMMAND ${CMAKE_COMMAND} -DRC=3 "-DMATCH=renaissance: error: ${says}" -DONE_LINE_ERROR=1
                   -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake --
                   $<TARGET_FILE:renaissance_cli> run --model ${CMAKE_CURRENT_LIST_DIR}/tiny_layout.json --steps 2 --backend cpu)
  set_tests_properties(cli_run_cpu_switch_malformed_${tag} PROPERTIES LABELS cli TIMEOUT 120 ENVIRONMENT "${variable}")
endforeach()
# The replay and the audit take the switches too (a malformed one is refused there as well).
add_test(NAME cli_replay_cpu_switch_malformed
         COMMAND ${CMAKE_COMMAND} -DRC=3 "-DMATCH=RENAISSANCE_CPU_HUGEPAGES=2: expected 0 or 1"
                 -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake --
                 $<TARGET_FILE:renaissance_cli> replay ${CMAKE_SOURCE_DIR}/testdata/replay/adamw --backend cpu)
set_tests_properties(cli_replay_cpu_switch_malformed PROPERTIES LABELS cli TIMEOUT 120 ENVIRONMENT "RENAISSANCE_CPU_HUGEPAGES=2")
add_test(NAME cli_audit_cpu_switch_malformed
         COMMAND ${CMAKE_COMMAND} -DRC=3 "-DMATCH=RENAISSANCE_CPU_PREFETCH=-1: expected a non-negative integer"
                 -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- $<TARGET_FILE:renaissance_cli> audit --steps 4)
set_tests_properties(cli_audit_cpu_switch_malformed PROPERTIES LABELS cli TIMEOUT 120 ENVIRONMENT "RENAISSANCE_CPU_PREFETCH=-1")
