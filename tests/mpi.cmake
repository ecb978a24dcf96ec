# MPI tests, included by tests/CMakeLists.txt:
#   include(${CMAKE_CURRENT_SOURCE_DIR}/mpi.cmake)
#
# meshflow_mpi_test (tests/mpi/mpi_main.cc) runs under mpirun: the transport's
# send/recv/send_recv, every collective of the Communicator over the mpi
# transport (each rank checks its own result), and the same all_reduce under
# the local backend in-process, compared bit for bit. Failure tests check that
# a rank that aborts, throws, is SIGKILLed or stops communicating ends the
# whole job non-zero within 30 s with a message naming it. Every mpirun runs under `timeout 60`, so a hang
# fails the test instead of blocking CI.
#
#   ctest -L mpi --output-on-failure
#
# mpirun flags (Open MPI): root in CI needs --allow-run-as-root; 2-core boxes
# need --oversubscribe; `--mca btl self,vader` keeps traffic in shared memory
# (no network probing); mpi_yield_when_idle stops waiting ranks from spinning
# on cores the other ranks need.
if(NOT TARGET MPI::MPI_CXX)
  set(MPI_CXX_SKIP_MPICXX ON)  # the C API only; no deprecated C++ bindings library
  find_package(MPI COMPONENTS CXX)
endif()
if(NOT TARGET MPI::MPI_CXX)
  message(STATUS "meshflow: MPI not found; the mpi tests are not built")
  return()
endif()

add_executable(meshflow_mpi_test ${CMAKE_CURRENT_LIST_DIR}/mpi/mpi_main.cc
  ${CMAKE_CURRENT_LIST_DIR}/mpi/collective_checks.cc)
target_link_libraries(meshflow_mpi_test PRIVATE meshflow)

set(MESHFLOW_MPIRUN ${MPIEXEC_EXECUTABLE})
if(NOT MESHFLOW_MPIRUN)
  find_program(MESHFLOW_MPIRUN NAMES mpirun mpiexec REQUIRED)
endif()
set(MESHFLOW_MPIRUN_FLAGS)
execute_process(COMMAND ${MESHFLOW_MPIRUN} --version OUTPUT_VARIABLE _mf_mpirun_version
  ERROR_QUIET)
if(_mf_mpirun_version MATCHES "Open MPI|OpenRTE")
  set(MESHFLOW_MPIRUN_FLAGS --allow-run-as-root --oversubscribe --mca btl self,vader
    --mca mpi_yield_when_idle 1)
endif()
set(_mf_mpi_env "OMP_NUM_THREADS=1" ${MESHFLOW_TEST_ENV})

# Correctness at 2, 3 and 4 ranks; once more with MPI's smallest legal tag range
# (15 bits) and 64 KiB message chunks so the hashed tags and the >2 GiB split
# path are exercised without 2 GiB buffers.
foreach(np 2 3 4)
  add_test(NAME mpi_collectives_np${np}
    COMMAND timeout 60 ${MESHFLOW_MPIRUN} ${MESHFLOW_MPIRUN_FLAGS} -np ${np}
      $<TARGET_FILE:meshflow_mpi_test> check)
  set_tests_properties(mpi_collectives_np${np} PROPERTIES
    LABELS mpi TIMEOUT 90 PROCESSORS 2 ENVIRONMENT "${_mf_mpi_env}")
endforeach()
add_test(NAME mpi_small_tags_chunks_np3
  COMMAND timeout 60 ${MESHFLOW_MPIRUN} ${MESHFLOW_MPIRUN_FLAGS} -np 3
    $<TARGET_FILE:meshflow_mpi_test> check)
set_tests_properties(mpi_small_tags_chunks_np3 PROPERTIES
  LABELS mpi TIMEOUT 90 PROCESSORS 2
  ENVIRONMENT "${_mf_mpi_env};MESHFLOW_MPI_TAG_BITS=15;MESHFLOW_MPI_CHUNK_BYTES=65536")

# Failure: rank 1 calls Transport::abort, throws (main returns 1), is
# SIGKILLed, or stalls (alive, silent: the others time out after
# MESHFLOW_COMM_TIMEOUT_S) in the middle of a stream of all_reduces.
foreach(mode abort throw kill stall)
  add_test(NAME mpi_failure_${mode}
    COMMAND sh ${CMAKE_CURRENT_LIST_DIR}/mpi/expect_failure.sh 1
      ${MESHFLOW_MPIRUN} ${MESHFLOW_MPIRUN_FLAGS} -np 3
      $<TARGET_FILE:meshflow_mpi_test> fail-${mode} 1)
  set_tests_properties(mpi_failure_${mode} PROPERTIES
    LABELS mpi TIMEOUT 90 PROCESSORS 2 ENVIRONMENT "${_mf_mpi_env};MESHFLOW_COMM_TIMEOUT_S=5")
endforeach()

# One real >2 GiB message (about 5 GiB of memory), only with -C large:
#   ctest -C large -R mpi_large_message --output-on-failure
add_test(NAME mpi_large_message CONFIGURATIONS large
  COMMAND timeout 300 ${MESHFLOW_MPIRUN} ${MESHFLOW_MPIRUN_FLAGS} -np 2
    $<TARGET_FILE:meshflow_mpi_test> large)
set_tests_properties(mpi_large_message PROPERTIES
  LABELS mpi_large TIMEOUT 360 PROCESSORS 2 ENVIRONMENT "${_mf_mpi_env}")

# A job across two "hosts": network namespaces on this machine joined by veth
# pairs on a bridge (tests/mpi/netns_check.sh); the run equals --ranks 2, and
# cutting one host's link mid-run ends every rank within 30 s naming the rank.
# Needs root and ip(8): skipped (exit 77) without them.
foreach(mode equal cut)
  add_test(NAME mpi_netns_${mode}
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/mpi/netns_check.sh $<TARGET_FILE:meshflow_cli>
      ${MESHFLOW_MPIRUN} ${mode})
  set_tests_properties(mpi_netns_${mode} PROPERTIES
    LABELS mpi TIMEOUT 120 RUN_SERIAL TRUE SKIP_RETURN_CODE 77 ENVIRONMENT "${_mf_mpi_env}")
endforeach()
