# Installs kevo into a scratch prefix, then configures, builds and runs the consumer against it.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGV}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${KEVO_BUILD_DIR} --prefix ${prefix})
set(cuda_args)
if(CUDA_COMPILER)
  set(cuda_args -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER})
endif()
# No build type (no -O, no -g): what is checked is that the package is found and its code compiles,
# links and runs, not how fast; kevo.hpp's units then build in about a third of Release's time, the
# consumers two at a time (this test was the suite's longest, 190 s; issue 50).
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE= ${cuda_args})
run(${CMAKE_COMMAND} --build ${WORK_DIR}/build --parallel 2)
run(${WORK_DIR}/build/kevo_consumer)
run(${WORK_DIR}/build/kevo_core_consumer)
# The installed kevo::postgres, against the test fixture's server (ctest gives its conninfo).
if(EXPECT_POSTGRES)
  if(NOT EXISTS ${WORK_DIR}/build/kevo_postgres_consumer)
    message(FATAL_ERROR "kevo was built with kevo::postgres, but the installed package does not define it")
  endif()
  if(DEFINED ENV{KEVO_TEST_POSTGRES})
    run(${WORK_DIR}/build/kevo_postgres_consumer)
  else()
    message(WARNING "KEVO_TEST_POSTGRES is unset: the installed kevo::postgres was built against, not run (ctest sets it)")
  endif()
endif()
if(CUDA_COMPILER)
  run(${WORK_DIR}/build/kevo_cuda_consumer)
endif()
# kevo::core links none of kevo's heavier dependencies.
execute_process(COMMAND ldd ${WORK_DIR}/build/kevo_core_consumer OUTPUT_VARIABLE core_libraries)
if(core_libraries MATCHES "libsqlite3|libssl|libcrypto|libsimdjson|libseccomp")
  message(FATAL_ERROR "kevo_core_consumer links more than kevo::core should:\n${core_libraries}")
endif()
# The installed kevo-search (where the build made it) finds a shipped problem by its name, in
# share/kevo beside it, from a directory that holds no problems.
if(EXISTS ${prefix}/bin/kevo-search)
  file(MAKE_DIRECTORY ${WORK_DIR}/elsewhere)
  execute_process(COMMAND ${prefix}/bin/kevo-search softmax --budget 1 --jobs 1
                  WORKING_DIRECTORY ${WORK_DIR}/elsewhere RESULT_VARIABLE rc OUTPUT_VARIABLE said ERROR_VARIABLE said)
  if(NOT rc EQUAL 0 OR NOT said MATCHES "softmax")
    message(FATAL_ERROR "the installed kevo-search did not search the shipped softmax by name (${rc}):\n${said}")
  endif()
  message(STATUS "installed kevo-search: found the shipped softmax by name")
endif()

