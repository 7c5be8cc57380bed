# ctest entries for issue 12 (careless and hostile use): one test per numbered item of the issue
# (08 has two), each a SCENARIO of hostile_input.cmake. Label: cli;hostile.
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
