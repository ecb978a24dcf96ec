# End-to-end data-parallel checks through the CLI (tests/dp_cli_check.sh).
set(_mf_dp ${CMAKE_CURRENT_LIST_DIR}/dp_cli_check.sh)
add_test(NAME dp_local_rank_failure COMMAND bash ${_mf_dp} $<TARGET_FILE:meshflow_cli> none local-throw)
set_tests_properties(dp_local_rank_failure PROPERTIES TIMEOUT 120 LABELS dp ENVIRONMENT "${MESHFLOW_TEST_ENV}")
if(MPIEXEC_EXECUTABLE)
  foreach(mode equal mpi-kill mpi-throw mpi-resume mpi-launch)
    add_test(NAME dp_mpi_${mode} COMMAND bash ${_mf_dp} $<TARGET_FILE:meshflow_cli> ${MPIEXEC_EXECUTABLE} ${mode})
    set_tests_properties(dp_mpi_${mode} PROPERTIES TIMEOUT 180 LABELS "dp;mpi" RUN_SERIAL TRUE
      ENVIRONMENT "${MESHFLOW_TEST_ENV}")
  endforeach()
endif()
