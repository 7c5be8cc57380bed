# The options of sharded runs that need no launcher (docs/distributed.md): each mistake is one
# error line and exit 2, before MPI starts. The MPI runs themselves are tested in tests/comm/.
rn_cli_test(cli_dist_grad_reduce_alone 2 "-DMATCH=--grad-reduce ordered: needs --distributed mpi" -DONE_LINE_ERROR=1
            -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- ${RN_CLI} run --model ${RN_TINY} --grad-reduce ordered)
rn_cli_test(cli_dist_bad_grad_reduce 2 "-DMATCH=expected replicated, ordered or fast" -DONE_LINE_ERROR=1
            -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- ${RN_CLI} run --model ${RN_TINY} --distributed mpi --grad-reduce sum)
rn_cli_test(cli_dist_cuda 2 "-DMATCH=CUDA ranks run with --distributed nccl" -DONE_LINE_ERROR=1
            -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- ${RN_CLI} run --model ${RN_TINY} --distributed mpi --backend cuda)
rn_cli_test(cli_dist_nccl_cpu 2 "-DMATCH=NCCL ranks run the CUDA backend" -DONE_LINE_ERROR=1
            -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- ${RN_CLI} run --model ${RN_TINY} --distributed nccl --backend cpu)
if(NOT RENAISSANCE_WITH_NCCL)
  rn_cli_test(cli_dist_nccl 2 "-DMATCH=this build has no NCCL communicator" -DONE_LINE_ERROR=1
              -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- ${RN_CLI} run --model ${RN_TINY} --distributed nccl)
endif()
rn_cli_test(cli_dist_unknown_engine 2 "-DMATCH=--distributed gloo: expected mpi .CPU ranks. or nccl" -DONE_LINE_ERROR=1
            -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- ${RN_CLI} run --model ${RN_TINY} --distributed gloo)
rn_cli_test(cli_dist_simulate_and_distributed 2 "-DMATCH=cannot be combined with --distributed" -DONE_LINE_ERROR=1
            -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- ${RN_CLI} run --model ${RN_TINY} --distributed mpi --simulate-ranks 2)
rn_cli_test(cli_dist_simulate_zero 2 "-DMATCH=--simulate-ranks 0: out of range" -DONE_LINE_ERROR=1
            -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- ${RN_CLI} run --model ${RN_TINY} --simulate-ranks 0)
if(NOT RENAISSANCE_WITH_MPI)
  rn_cli_test(cli_dist_no_mpi 2 "-DMATCH=this build has no MPI communicator" -DONE_LINE_ERROR=1
              -P ${CMAKE_CURRENT_LIST_DIR}/expect.cmake -- ${RN_CLI} run --model ${RN_TINY} --distributed mpi)
endif()
