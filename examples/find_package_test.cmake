# ctest install_find_package: installs this build into a scratch prefix, then configures, builds
# and runs examples/ as a separate project through find_package(Renaissance) — what a user's
# project does. Usage: cmake -DBUILD=... -DSOURCE=... -DWORK=... -DGENERATOR=... -P this file
file(REMOVE_RECURSE ${WORK})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD} --prefix ${WORK}/prefix)
run(${CMAKE_COMMAND} -S ${SOURCE}/examples -B ${WORK}/build -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_PREFIX_PATH=${WORK}/prefix "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${LINKER_FLAGS}")
run(${CMAKE_COMMAND} --build ${WORK}/build)
run(${WORK}/build/quickstart)
if(NOT last_output MATCHES "fingerprint [0-9a-f]+")
  message(FATAL_ERROR "quickstart printed no fingerprint:\n${last_output}")
endif()
message(STATUS "installed package works: ${last_output}")
