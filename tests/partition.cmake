# End-to-end checks of the SPMD partitioner through the CLI (tests/partition_cli_check.sh).
set(_mf_pc ${CMAKE_CURRENT_LIST_DIR}/partition_cli_check.sh)
foreach(mode explain errors auto)
  add_test(NAME partition_cli_${mode} COMMAND bash ${_mf_pc} $<TARGET_FILE:meshflow_cli> none ${mode})
  set_tests_properties(partition_cli_${mode} PROPERTIES TIMEOUT 120 LABELS partition
    ENVIRONMENT "${MESHFLOW_TEST_ENV}")
endforeach()
if(MPIEXEC_EXECUTABLE)
  add_test(NAME partition_mpi_equal COMMAND bash ${_mf_pc} $<TARGET_FILE:meshflow_cli> ${MPIEXEC_EXECUTABLE} mpi-equal)
  set_tests_properties(partition_mpi_equal PROPERTIES TIMEOUT 180 LABELS "partition;mpi" RUN_SERIAL TRUE
    ENVIRONMENT "${MESHFLOW_TEST_ENV}")
endif()
