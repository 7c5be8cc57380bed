# ctest entries for careless and hostile use of the CLI: one test per numbered SCENARIO of
# hostile_input.cmake (08 has two). Label: cli;hostile.
set(RN_HOSTILE_CASE ${CMAKE_SOURCE_DIR}/testdata/replay/adamw)
foreach(scenario 01_threads 02_inputs 03_float32 04_counts 05_rank 06_fifo 07_empty 08_resume_example
                 08_resume_refuses 09_out_folder 10_no_clobber 11_replay_out 12_expected_symlink
                 13_control_chars 14_stale_temps 15_exit3)
  add_test(NAME cli_hostile_${scenario}
           COMMAND ${CMAKE_COMMAND} -DCLI=$<TARGET_FILE:renaissance_cli> -DLAYOUT=${CMAKE_CURRENT_LIST_DIR}/tiny_layout.json
                   -DCASE=${RN_HOSTILE_CASE} -DWORK=${CMAKE_CURRENT_BINARY_DIR}/hostile/${scenario} -DSCENARIO=${scenario}
                   -P ${CMAKE_CURRENT_LIST_DIR}/hostile_input.cmake)
  set_tests_properties(cli_hostile_${scenario} PROPERTIES LABELS "cli;hostile" TIMEOUT 240)
endforeach()
# Item 14, memory half: a resume peaks within 1.2x of a plain run's RSS (needs only python3).
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_EXECUTABLE)
  add_test(NAME cli_hostile_14_resume_memory
           COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/resume_memory.py $<TARGET_FILE:renaissance_cli>
                   ${CMAKE_CURRENT_BINARY_DIR}/hostile/14_resume_memory)
  set_tests_properties(cli_hostile_14_resume_memory PROPERTIES LABELS "cli;hostile" TIMEOUT 240)
else()
  message(WARNING "python3 not found: cli_hostile_14_resume_memory is not registered")
endif()
