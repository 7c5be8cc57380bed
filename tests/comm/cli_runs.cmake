# ctest script (cmake -P) for `renaissance run --distributed mpi` through the real CLI under
# mpirun. -DCLI=... -DMPIRUN=... -DLAYOUT=... -DWORK=... -DCASE=reshard|lost|equal|copies
#   equal:   (lars and muon, clipping) mpirun -np 2/3 --grad-reduce replicated prints the plain run's
#            fingerprint, ordered the --simulate-ranks K one (every kind: sharded_runs.cc); --json carries world_size, grad_reduce, comm_ms_per_step.
#            The same at K = 2 with a model copy: --precision bf16 --stochastic-rounding (lamb),
#            and with model-dtype gradients: --precision fp16 --grad-dtype model (adamw).
#   reshard: (lamb, clipping) a checkpoint saved at K = 2 (one gathered file) resumed at K = 1 and 3: replicated
#            ends with the uninterrupted plain run's fingerprint; ordered at K = 3 with that of
#            --simulate-ranks 3 resumed from the same file. Then (adamw) the same with a bf16
#            model copy rounded stochastically, saved at K = 2, resumed at K = 1 and 3; muon; adam with
#            amsgrad (VMAX).
#   lost:    rank 1 killed at batch 2 (RENAISSANCE_TEST_LOSE_RANK): the launcher exits non-zero
#            within 50 s and its message names rank 1.
#   mismatch: -DFLAG=--opt -DODD=arg^arg [-DBASE=arg^arg] [-DRANKS=2|3] [-DEXPECT=0]: MPMD, every
#            rank given BASE, rank 1 also the arguments ODD (^ separates them; <work> is WORK,
#            which holds two altered copies of LAYOUT), the other ranks not: the launcher exits 2 within
#            10 s (mpirun --timeout 10 ends a hang) and the message names FLAG as the first
#            difference with rank 1 apart; EXPECT=0: the ranks may differ so (exit 0).
#   copies:  mpirun -np 2 without --distributed, and an MPMD launch with it on one rank only: exit 2
#            within 10 s saying --distributed is missing; nothing ran, no checkpoint written.
include(${CMAKE_CURRENT_LIST_DIR}/../cli/cli_checks.cmake)
set(ENV{OMPI_ALLOW_RUN_AS_ROOT} 1)
set(ENV{OMPI_ALLOW_RUN_AS_ROOT_CONFIRM} 1)
set(ENV{OMP_NUM_THREADS} 1)
set(ENV{OMPI_MCA_btl_vader_single_copy_mechanism} none)  # no ptrace rights needed (containers)
file(MAKE_DIRECTORY ${WORK})
set(COMMON --model ${LAYOUT} --threads 1 --seed 3 --loss-scale 128 --schedule cosine --warmup 1)

# The run ARGN at K ranks, `plain` holding its one-process fingerprint: replicated ends with
# plain, ordered with --simulate-ranks K; `what` names the configuration in the messages.
macro(expect_sharded_equal what K)
  fingerprint(sim ${CLI} run ${ARGN} --simulate-ranks ${K})
  fingerprint(rep ${MPI_RUN} ${K} ${CLI} run ${ARGN} --distributed mpi --grad-reduce replicated)
  expect_same("${what} K=${K} replicated == plain" ${rep} ${plain})
  fingerprint(ord ${MPI_RUN} ${K} ${CLI} run ${ARGN} --distributed mpi --grad-reduce ordered)
  expect_same("${what} K=${K} ordered == --simulate-ranks ${K}" ${ord} ${sim})
endmacro()

# The run ARGN (6 steps) saved at K = 2 ranks after 3 steps into the checkpoint `ck`, resumed at
# K = 1 and 3 (replicated), ends with the fingerprint of the 6 uninterrupted steps, which it
# leaves in `whole`.
macro(expect_reshard_resumes what ck)
  file(REMOVE ${ck})
  fingerprint(whole ${CLI} run ${ARGN} --steps 6)
  fingerprint(saved ${MPI_RUN} 2 ${CLI} run ${ARGN} --steps 3 --checkpoint ${ck} --distributed mpi --grad-reduce replicated)
  foreach(K 1 3)
    fingerprint(resumed ${MPI_RUN} ${K} ${CLI} run --model ${LAYOUT} --threads 1 --steps 6 --resume ${ck}
                --distributed mpi --grad-reduce replicated)
    expect_same("${what} saved at K=2, resumed at K=${K} (replicated) == uninterrupted" ${resumed} ${whole})
  endforeach()
endmacro()

# Runs the command ARGN for at most `limit` seconds and echoes its output; sets rc, out, err,
# seconds (how long it took) and words (the command as one line, for messages) in the caller.
macro(run_timed limit)
  string(TIMESTAMP t0 "%s")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${limit})
  string(TIMESTAMP t1 "%s")
  math(EXPR seconds "${t1} - ${t0}")
  message("${out}${err}")
  string(REPLACE ";" " " words "${ARGN}")
endmacro()

# Runs a command, fails the test on a non-zero exit, returns the fingerprint of its output.
function(fingerprint out_var)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 50)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "exit ${rc}: ${ARGN}\n${out}${err}")
  endif()
  if(NOT out MATCHES "fingerprint +([0-9a-f]+)")
    message(FATAL_ERROR "no fingerprint from: ${ARGN}\n${out}${err}")
  endif()
  set(${out_var} ${CMAKE_MATCH_1} PARENT_SCOPE)
  set(LAST_OUT "${out}" PARENT_SCOPE)
endfunction()

function(expect_same what a b)
  if(NOT a STREQUAL b)
    message(FATAL_ERROR "${what}: ${a} != ${b}")
  endif()
  message("ok ${what}: ${a}")
endfunction()

set(MPI_RUN ${MPIRUN} --oversubscribe -np)
if(CASE STREQUAL "equal")
  foreach(kind lars muon)
    set(args ${COMMON} --optimizer ${kind} --steps 5 --nan-at 2 --max-grad-norm 0.05)
    fingerprint(plain ${CLI} run ${args})
    foreach(K 2 3)
      expect_sharded_equal(${kind} ${K} ${args})
    endforeach()
  endforeach()
  set(args ${COMMON} --optimizer lamb --steps 5 --nan-at 2 --max-grad-norm 0.05 --precision bf16 --stochastic-rounding)
  fingerprint(plain ${CLI} run ${args})
  expect_sharded_equal("lamb bf16 stochastic" 2 ${args})
  # Model-dtype gradients (fp16, each rank's G widened before the fp32 rank-order sum).
  set(args ${COMMON} --optimizer adamw --steps 5 --nan-at 2 --max-grad-norm 0.05 --precision fp16 --grad-dtype model)
  fingerprint(plain ${CLI} run ${args})
  expect_sharded_equal("adamw fp16 --grad-dtype model" 2 ${args})
  execute_process(COMMAND ${MPI_RUN} 3 ${CLI} run ${COMMON} --steps 2 --distributed mpi --grad-reduce fast --json
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 50)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "\"world_size\":3" OR NOT out MATCHES "\"grad_reduce\":\"fast\""
     OR NOT out MATCHES "\"comm_ms_per_step\":[0-9]")
    message(FATAL_ERROR "--json of a 3-rank run lacks world_size/grad_reduce/comm_ms_per_step (exit ${rc}):\n${out}${err}")
  endif()
  string(REGEX MATCHALL "\"fingerprint\"" lines "${out}")
  list(LENGTH lines n)
  if(NOT n EQUAL 1)
    message(FATAL_ERROR "expected rank 0 alone to print, got ${n} results:\n${out}")
  endif()
elseif(CASE STREQUAL "reshard")
  set(ck ${WORK}/k2.ckpt)
  expect_reshard_resumes(lamb ${ck} ${COMMON} --optimizer lamb --max-grad-norm 0.05 --schedule-steps 6)
  fingerprint(ord ${MPI_RUN} 3 ${CLI} run --model ${LAYOUT} --threads 1 --steps 6 --resume ${ck}
              --distributed mpi --grad-reduce ordered)
  fingerprint(sim ${CLI} run --model ${LAYOUT} --threads 1 --steps 6 --resume ${ck} --simulate-ranks 3)
  expect_same("lamb saved at K=2, resumed ordered at K=3 == --simulate-ranks 3 resumed" ${ord} ${sim})
  expect_reshard_resumes("adamw bf16 stochastic" ${WORK}/k2-bf16.ckpt ${COMMON} --optimizer adamw --max-grad-norm 0.05
                         --schedule-steps 6 --precision bf16 --stochastic-rounding)
  # Muon: the momentum of the matrices, saved from their owners' slices into the one file.
  expect_reshard_resumes(muon ${WORK}/k2-muon.ckpt ${COMMON} --optimizer muon --max-grad-norm 0.05 --schedule-steps 6)
  # amsgrad: VMAX saved from the ranks' slices into the one file, as V.
  expect_reshard_resumes("adam amsgrad" ${WORK}/k2-amsgrad.ckpt ${COMMON} --optimizer adam --amsgrad --max-grad-norm 0.05
                         --schedule-steps 6)
elseif(CASE STREQUAL "lost")
  set(ENV{RENAISSANCE_TEST_LOSE_RANK} "1:2")
  run_timed(50 ${MPI_RUN} 3 ${CLI} run ${COMMON} --steps 6 --distributed mpi --grad-reduce ordered)
  if(rc EQUAL 0)
    message(FATAL_ERROR "the launcher exited 0 although rank 1 was lost")
  endif()
  if(NOT rc MATCHES "^[0-9]+$")
    message(FATAL_ERROR "the launcher did not end by itself within 50 s (${rc}): a hang")
  endif()
  if(NOT "${out}${err}" MATCHES "rank 1")
    message(FATAL_ERROR "the launcher's message does not name the lost rank 1")
  endif()
  message("ok: launcher exit ${rc} after ${seconds} s, naming rank 1")
elseif(CASE STREQUAL "mismatch")
  # A layout of the same name and tensor count with one tensor of another size (different
  # partitions), and one with a tensor transposed (same sizes: only the tensors' digest tells).
  file(READ ${LAYOUT} layout_text)
  string(REPLACE "[64, 3, 7, 7]" "[64, 3, 5, 5]" sized "${layout_text}")
  string(REPLACE "[64, 3, 7, 7]" "[3, 64, 7, 7]" transposed "${layout_text}")
  if(sized STREQUAL layout_text OR transposed STREQUAL layout_text)
    message(FATAL_ERROR "${LAYOUT} has no tensor of shape [64, 3, 7, 7] to change")
  endif()
  file(WRITE ${WORK}/sized.json "${sized}")
  file(WRITE ${WORK}/transposed.json "${transposed}")
  string(REPLACE "^" ";" odd "${ODD}")
  string(REPLACE "<work>" "${WORK}" odd "${odd}")
  if(NOT DEFINED RANKS)
    set(RANKS 2)
  endif()
  if(NOT DEFINED EXPECT)
    set(EXPECT 2)
  endif()
  string(REPLACE "^" ";" common "${BASE}")
  set(base ${CLI} run --model ${LAYOUT} --threads 1 --steps 3 --distributed mpi ${common})
  set(cmd ${MPIRUN} --oversubscribe --timeout 10 -np 1 ${base} : -np 1 ${base} ${odd})
  if(RANKS EQUAL 3)
    list(APPEND cmd : -np 1 ${base})
  endif()
  run_timed(40 ${cmd})
  if(NOT "${rc}" STREQUAL "${EXPECT}")
    if("${out}${err}" MATCHES "time limit for job execution has been reached" OR NOT rc MATCHES "^[0-9]+$")
      message(FATAL_ERROR "a hang: ended by the time limit after ${seconds} s (exit ${rc}): ${words}")
    endif()
    message(FATAL_ERROR "exit ${rc} after ${seconds} s, expected ${EXPECT}: ${words}")
  endif()
  if(EXPECT EQUAL 2)
    if(RANKS EQUAL 3)
      set(others "ranks 0, 2")
    else()
      set(others "rank 0")
    endif()
    if(NOT "${out}${err}" MATCHES "the ranks were given different configurations: ${FLAG} differs: [^\n]* on ${others}; [^\n]* on rank 1")
      message(FATAL_ERROR "the message does not name ${FLAG} as the first difference (${others} against rank 1)")
    endif()
    if("${out}" MATCHES "fingerprint")
      message(FATAL_ERROR "a rank ran although the configurations differ")
    endif()
  endif()
  message("ok: exit ${rc} after ${seconds} s")
elseif(CASE STREQUAL "copies")
  # mpirun -np 2 renaissance run without --distributed: refused on every process (exit 2 within
  # 10 s, nothing run, no checkpoint written) instead of two whole runs writing one file; and an
  # MPMD launch where one rank lacks --distributed ends the job instead of leaving the other rank
  # waiting for it.
  set(ck ${WORK}/copies.ckpt)
  file(REMOVE ${ck})
  set(plain ${CLI} run --model ${LAYOUT} --threads 1 --steps 3)
  foreach(form copies mpmd)
    if(form STREQUAL "copies")
      set(cmd ${MPIRUN} --oversubscribe --timeout 10 -np 2 ${plain} --checkpoint ${ck})
    else()
      set(cmd ${MPIRUN} --oversubscribe --timeout 10 -np 1 ${plain} --distributed mpi : -np 1 ${plain})
    endif()
    run_timed(40 ${cmd})
    # Exit 2, saying that --distributed is missing under mpirun.
    expect_exit_and_output("${form} (${seconds} s): ${words}" 2
                           "this process is one of 2 started by an MPI launcher \\(OMPI_COMM_WORLD_SIZE=2\\) but --distributed is not given")
    if("${out}" MATCHES "fingerprint" OR EXISTS ${ck})
      message(FATAL_ERROR "${form}: a process ran (a fingerprint printed or ${ck} written)")
    endif()
    if(seconds GREATER 10)
      message(FATAL_ERROR "${form}: took ${seconds} s")
    endif()
    message("ok ${form}: exit ${rc} after ${seconds} s")
  endforeach()
else()
  message(FATAL_ERROR "unknown CASE ${CASE}")
endif()
