# ctest helper (cmake -P): careless and hostile uses of the CLI, one SCENARIO per
# numbered item. Every command runs under a timeout (a hang is a failure, not a stuck CI job) and every
# refusal must be exit 2 with one "renaissance: error:" line naming the thing, unless noted.
# Input: CLI, LAYOUT (a small layout file), CASE (a replay case folder), WORK, SCENARIO.
cmake_minimum_required(VERSION 3.16)
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
string(ASCII 27 ESC)
include(${CMAKE_CURRENT_LIST_DIR}/cli_checks.cmake)

# run_cli(<rc> <regex> ARGS...): the CLI's exit code must be <rc> and stdout+stderr match <regex>;
# for rc 2 and 3 stderr must be exactly one error line. Sets OUT and ERR in the caller.
function(run_cli want regex)
  execute_process(COMMAND ${CLI} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 30)
  expect_exit_and_output("renaissance ${ARGN}" ${want} "${regex}")
  if(want GREATER 1)
    expect_one_error_line("${err}" "renaissance ${ARGN}: ")
  endif()
  message("ok (${rc}): renaissance ${ARGN}\n   ${err}")
  set(OUT "${out}" PARENT_SCOPE)
  set(ERR "${err}" PARENT_SCOPE)
endfunction()

function(fingerprint out_var)
  run_cli(0 "fingerprint" run --model ${LAYOUT} --backend cpu --json ${ARGN})
  string(JSON fp GET "${OUT}" fingerprint)
  set(${out_var} "${fp}" PARENT_SCOPE)
  set(OUT "${OUT}" PARENT_SCOPE)
endfunction()

# run_sh(<rc> <regex> <shell words>): for arguments a CMake list cannot carry (an empty one); the
# words follow "renaissance" in a sh command line.
function(run_sh want regex words)
  execute_process(COMMAND sh -c "exec \"$0\" ${words}" ${CLI} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err
                  TIMEOUT 30)
  if(NOT "${rc}" STREQUAL "${want}" OR NOT "${out}${err}" MATCHES "${regex}" OR NOT err MATCHES "^renaissance: error: [^\n]*\n$")
    message(FATAL_ERROR "renaissance ${words}: expected exit ${want} and one error line matching '${regex}', got '${rc}': ${out}${err}")
  endif()
  message("ok (${rc}): renaissance ${words}\n   ${err}")
endfunction()

function(must_equal a b what)
  if(NOT "${a}" STREQUAL "${b}")
    message(FATAL_ERROR "${what}: '${a}' vs '${b}'")
  endif()
endfunction()

function(copy_case dst)
  file(COPY ${CASE}/ DESTINATION ${dst})
endfunction()

function(mkfifo path)
  execute_process(COMMAND mkfifo ${path} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "mkfifo ${path} failed")
  endif()
endfunction()

function(expect_fifo path)
  execute_process(COMMAND test -p ${path} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${path} is no longer a FIFO: it was replaced")
  endif()
endfunction()

set(RUN run --model ${LAYOUT} --backend cpu --steps 3)

if(SCENARIO STREQUAL "01_threads")
  # A crash in libgomp (100000) or its "Thread creation failed" with exit 1 (40000) before.
  run_cli(2 "--threads 100000: out of range" ${RUN} --threads 100000)
  run_cli(2 "--threads 40000: out of range" ${RUN} --threads 40000)
  run_cli(2 "--threads 1025: out of range" ${RUN} --threads 1025)
  run_cli(2 "--threads 100000" replay ${CASE} --threads 100000)
  execute_process(COMMAND ${CMAKE_COMMAND} -E env OMP_THREAD_LIMIT=2 ${CLI} ${RUN} --threads 3
                  RESULT_VARIABLE rc ERROR_VARIABLE err TIMEOUT 30)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "OMP_THREAD_LIMIT")
    message(FATAL_ERROR "--threads 3 under OMP_THREAD_LIMIT=2: expected exit 2 naming the limit, got ${rc}: ${err}")
  endif()
  run_cli(0 "fingerprint" ${RUN} --threads 2)

elseif(SCENARIO STREQUAL "02_inputs")
  # /dev/zero grew memory forever, a folder was "not valid JSON", a huge file was read whole.
  run_cli(2 "/dev/zero is a character device, not a regular file" run --model /dev/zero --steps 1)
  run_cli(2 "is a folder, not a regular file" run --model ${WORK}/ --steps 1)
  execute_process(COMMAND truncate -s 2G ${WORK}/huge.json RESULT_VARIABLE rc)
  must_equal("${rc}" "0" "truncate -s 2G")
  run_cli(2 "huge.json: 2147483648 bytes, more than the 67108864" run --model ${WORK}/huge.json --steps 1)

elseif(SCENARIO STREQUAL "03_float32")
  # Valid doubles that are not float32 ran to NaN / -inf weights with exit 0.
  set(f32 "= [0-9.e+]+: is not finite as a float32")
  run_cli(2 "invalid lr ${f32}" ${RUN} --lr 1e39)
  run_cli(2 "invalid lr ${f32}" ${RUN} --lr 1e308)
  run_cli(2 "invalid weight_decay ${f32}" ${RUN} --weight-decay 1e300)
  run_cli(2 "1 - lr \\* weight_decay" ${RUN} --lr 1e30 --weight-decay 1e30)
  run_cli(2 "eps = 1e-50: rounds to 0 as a float32" ${RUN} --eps 1e-50)
  run_cli(2 "1 / loss scale" ${RUN} --loss-scale 1e-39)
  copy_case(${WORK}/case)
  file(READ ${WORK}/case/case.json json)
  string(JSON json SET "${json}" optimizer lr "1e39")
  file(WRITE ${WORK}/case/case.json "${json}")
  run_cli(2 "case.json.*invalid lr ${f32}" replay ${WORK}/case)

elseif(SCENARIO STREQUAL "04_counts")
  # --seed 999...9 and --seed -1 ran as 2^64-1.
  run_cli(2 "--seed 99999999999999999999999: (too large|not a whole number)" ${RUN} --seed 99999999999999999999999)
  run_cli(2 "--seed -1: not a whole number" ${RUN} --seed -1)
  run_cli(2 "--seed 18446744073709551616: too large" ${RUN} --seed 18446744073709551616)
  run_cli(2 "--steps 4294967297: out of range" run --model ${LAYOUT} --steps 4294967297)
  run_cli(2 "--steps -1: not a whole number" run --model ${LAYOUT} --steps -1)
  run_cli(2 "--warmup 1x: not a whole number" ${RUN} --warmup 1x)
  run_cli(2 "--checkpoint-every -2: not a whole number" ${RUN} --checkpoint-every -2)
  run_cli(2 "--steps 99999999999: out of range" audit --steps 99999999999)
  run_cli(0 "\"seed\":18446744073709551615" ${RUN} --json --seed 18446744073709551615)

elseif(SCENARIO STREQUAL "05_rank")
  # Rank 65 wrote a checkpoint that --resume refused; the limit is now checked where the layout
  # is read, and rank 64 round-trips.
  foreach(rank 64 65)
    set(shape "1")
    foreach(i RANGE 2 ${rank})
      string(APPEND shape ",1")
    endforeach()
    file(WRITE ${WORK}/rank${rank}.json
         "{\"name\":\"r\",\"params\":[{\"name\":\"w\",\"shape\":[${shape}],\"role\":\"deep_conv\"}]}")
  endforeach()
  run_cli(2 "rank65.json: parameter 0 'w': rank 65, more than the 64 allowed"
          run --model ${WORK}/rank65.json --steps 2 --checkpoint ${WORK}/r65.ckpt)
  if(EXISTS ${WORK}/r65.ckpt)
    message(FATAL_ERROR "a checkpoint was written for a rank-65 layout")
  endif()
  run_cli(0 "fingerprint" run --model ${WORK}/rank64.json --steps 2 --checkpoint ${WORK}/r64.ckpt)
  run_cli(0 "fingerprint" run --model ${WORK}/rank64.json --steps 4 --resume ${WORK}/r64.ckpt)

elseif(SCENARIO STREQUAL "06_fifo")
  # open() of a FIFO blocked forever; replay inputs that were FIFOs or /dev/zero hung or grew.
  mkfifo(${WORK}/fifo.ckpt)
  run_cli(2 "fifo.ckpt is a FIFO, not a regular file" ${RUN} --resume ${WORK}/fifo.ckpt)
  run_cli(2 "fifo.ckpt is a FIFO, not a regular file" run --model ${WORK}/fifo.ckpt --steps 1)
  copy_case(${WORK}/c1)
  file(REMOVE ${WORK}/c1/init.safetensors)
  mkfifo(${WORK}/c1/init.safetensors)
  run_cli(2 "init.safetensors is a FIFO, not a regular file" replay ${WORK}/c1)
  copy_case(${WORK}/c2)
  file(REMOVE ${WORK}/c2/grads.safetensors)
  file(CREATE_LINK /dev/zero ${WORK}/c2/grads.safetensors SYMBOLIC)
  run_cli(2 "grads.safetensors is a character device, not a regular file" replay ${WORK}/c2)
  copy_case(${WORK}/c3)
  file(REMOVE ${WORK}/c3/case.json)
  file(CREATE_LINK /dev/zero ${WORK}/c3/case.json SYMBOLIC)
  run_cli(2 "case.json is a character device, not a regular file" replay ${WORK}/c3)

elseif(SCENARIO STREQUAL "07_empty")
  # "" was ignored with exit 0.
  string(REPLACE ";" " " run_words "${RUN}")
  run_sh(2 "--resume: the value is empty" "${run_words} --resume ''")
  run_sh(2 "--checkpoint: the value is empty" "${run_words} --checkpoint ''")
  run_sh(2 "--model: the value is empty" "run --model '' --steps 1")
  run_sh(2 "--out: the value is empty" "replay ${CASE} --out ''")
  run_sh(2 "case folder is empty" "replay ''")

elseif(SCENARIO STREQUAL "08_resume_example")
  # The issue's example, bit for bit, warm-up included: 7 steps of a 20-step cosine schedule,
  # then a resume to 20 equals 20 straight steps; the same for the step schedule and a seed.
  foreach(sched cosine step)
    fingerprint(straight --steps 20 --schedule ${sched} --warmup 3 --seed 42 --nan-at 4)
    fingerprint(first --steps 7 --schedule ${sched} --schedule-steps 20 --warmup 3 --seed 42 --nan-at 4
                --checkpoint ${WORK}/${sched}.ckpt)
    fingerprint(resumed --resume ${WORK}/${sched}.ckpt --steps 20)
    message("${sched}: straight ${straight}, 7 + resumed ${resumed}")
    must_equal("${resumed}" "${straight}" "${sched}: split run vs straight run")
    string(JSON s GET "${OUT}" schedule)
    string(JSON h GET "${OUT}" schedule_steps)
    string(JSON seed GET "${OUT}" seed)
    string(JSON warm GET "${OUT}" warmup)
    must_equal("${s}/${h}/${seed}/${warm}" "${sched}/20/42/3" "--json after a resume reports what ran")
  endforeach()
  # Without --schedule-steps the horizon of a fresh run is its --steps (stored): 20 of 20.
  fingerprint(a --steps 20 --schedule cosine --optimizer lars)
  fingerprint(b --steps 20 --schedule cosine --optimizer lars --schedule-steps 20)
  must_equal("${a}" "${b}" "default --schedule-steps")

elseif(SCENARIO STREQUAL "08_resume_refuses")
  # Changed hyperparameters were silently ignored on resume while --json reported them.
  set(ck ${WORK}/a.ckpt)
  fingerprint(first --steps 4 --seed 5 --checkpoint ${ck})
  run_cli(2 "--weight-decay 0.5 \\(checkpoint: 0.01\\).*--override" ${RUN} --steps 8 --resume ${ck} --weight-decay 0.5)
  run_cli(2 "--beta1 0.5 \\(checkpoint: 0.9\\)" ${RUN} --steps 8 --resume ${ck} --beta1 0.5)
  run_cli(2 "--weight-decay 0.5 .*; --beta1 0.5 " ${RUN} --steps 8 --resume ${ck} --weight-decay 0.5 --beta1 0.5)
  run_cli(2 "--seed 6 \\(checkpoint: 5\\)" ${RUN} --steps 8 --resume ${ck} --seed 6)
  run_cli(2 "--schedule cosine \\(checkpoint: constant\\)" ${RUN} --steps 8 --resume ${ck} --schedule cosine)
  run_cli(2 "--optimizer lars \\(checkpoint: adamw\\)" ${RUN} --steps 8 --resume ${ck} --optimizer lars)
  run_cli(2 "not an option a resume may change" ${RUN} --steps 8 --resume ${ck} --override optimizer)
  # The same values given again, or left out, continue as saved.
  fingerprint(plain --steps 8 --resume ${ck})
  fingerprint(same --steps 8 --resume ${ck} --weight-decay 0.01 --seed 5)
  must_equal("${same}" "${plain}" "resume giving the stored values")
  fingerprint(straight --steps 8 --seed 5)
  must_equal("${plain}" "${straight}" "resume inherits the seed")
  fingerprint(changed --steps 8 --resume ${ck} --weight-decay 0.5 --override weight-decay)
  string(JSON wd GET "${OUT}" weight_decay)
  must_equal("${wd}" "0.5" "--json reports the overridden weight decay")
  if(changed STREQUAL plain)
    message(FATAL_ERROR "--override weight-decay did not change the run")
  endif()

elseif(SCENARIO STREQUAL "09_out_folder")
  # A bad --checkpoint folder failed only after every step had run.
  foreach(bad "${WORK}/missing/c.ckpt|does not exist" "/proc/sys/c.ckpt|is not writable" "${WORK}|is a folder")
    string(REPLACE "|" ";" bad "${bad}")
    list(GET bad 0 path)
    list(GET bad 1 why)
    run_cli(2 "--checkpoint .*${why}" run --model ${LAYOUT} --backend cpu --steps 50 --checkpoint ${path})
    if(ERR MATCHES "step [0-9]+/")
      message(FATAL_ERROR "--checkpoint ${path}: steps ran before the refusal: ${ERR}")
    endif()
  endforeach()
  run_cli(2 "--out .*does not exist" replay ${CASE} --out ${WORK}/missing/r.safetensors)

elseif(SCENARIO STREQUAL "10_no_clobber")
  # --checkpoint onto the --model file turned the layout into a checkpoint; a device or FIFO given
  # as --checkpoint / --out was replaced by a regular file.
  configure_file(${LAYOUT} ${WORK}/v.json COPYONLY)
  file(SHA256 ${WORK}/v.json before)
  run_cli(2 "--checkpoint .*v.json: is the layout file given as --model" run --model ${WORK}/v.json --steps 1 --checkpoint ${WORK}/v.json)
  file(CREATE_LINK ${WORK}/v.json ${WORK}/link.json SYMBOLIC)
  run_cli(2 "is the layout file given as --model" run --model ${WORK}/v.json --steps 1 --checkpoint ${WORK}/link.json)
  file(SHA256 ${WORK}/v.json after)
  must_equal("${after}" "${before}" "the layout file")
  mkfifo(${WORK}/out.fifo)
  run_cli(2 "out.fifo is a FIFO; only a regular file is ever replaced" ${RUN} --checkpoint ${WORK}/out.fifo)
  run_cli(2 "out.fifo is a FIFO; only a regular file is ever replaced" replay ${CASE} --out ${WORK}/out.fifo)
  expect_fifo(${WORK}/out.fifo)
  # A run may save over the checkpoint it resumed from.
  run_cli(0 "fingerprint" ${RUN} --checkpoint ${WORK}/c.ckpt)
  run_cli(0 "fingerprint" run --model ${LAYOUT} --backend cpu --steps 5 --resume ${WORK}/c.ckpt --checkpoint ${WORK}/c.ckpt)

elseif(SCENARIO STREQUAL "11_replay_out")
  # --out onto the case's own files replaced the reference (next replay "passed" with error 0).
  copy_case(${WORK}/c)
  foreach(f expected.safetensors case.json init.safetensors grads.safetensors)
    file(SHA256 ${WORK}/c/${f} before)
    run_cli(2 "--out .*is the case's ${f}; it would be overwritten" replay ${WORK}/c --out ${WORK}/c/${f})
    file(SHA256 ${WORK}/c/${f} after)
    must_equal("${after}" "${before}" "${f}")
  endforeach()
  run_cli(0 "PASS" replay ${WORK}/c --out ${WORK}/result.safetensors)

elseif(SCENARIO STREQUAL "12_expected_symlink")
  # A dangling or looping expected.safetensors counted as "no expected file", exit 0.
  copy_case(${WORK}/c)
  file(REMOVE ${WORK}/c/expected.safetensors)
  file(CREATE_LINK ${WORK}/c/nowhere ${WORK}/c/expected.safetensors SYMBOLIC)
  run_cli(2 "expected.safetensors: a symbolic link that leads nowhere" replay ${WORK}/c)
  file(REMOVE ${WORK}/c/expected.safetensors)
  file(CREATE_LINK ${WORK}/c/loop2 ${WORK}/c/expected.safetensors SYMBOLIC)
  file(CREATE_LINK ${WORK}/c/expected.safetensors ${WORK}/c/loop2 SYMBOLIC)
  run_cli(2 "expected.safetensors: a symbolic link that leads nowhere" replay ${WORK}/c)

elseif(SCENARIO STREQUAL "13_control_chars")
  # Names with terminal control characters were echoed raw.
  file(WRITE ${WORK}/esc.json
       "{\"name\":\"m\\u001b]0;title\",\"params\":[{\"name\":\"a\\u001b[31m\",\"shape\":[2],\"role\":\"deep_conv\"},{\"name\":\"a\\u001b[31m\",\"shape\":[2],\"role\":\"deep_conv\"}]}")
  run_cli(2 "'a\\\\x1b\\[31m': duplicate parameter name" run --model ${WORK}/esc.json --steps 1)
  file(WRITE ${WORK}/esc2.json
       "{\"name\":\"m\\u001b]0;title\",\"params\":[{\"name\":\"a\",\"shape\":[2],\"role\":\"deep_conv\"}]}")
  run_cli(0 "m\\\\x1b\\]0;title" run --model ${WORK}/esc2.json --steps 1)
  run_cli(2 "--schedule c\\\\x1b\\[2J: expected" ${RUN} --schedule "c${ESC}[2J")
  if(OUT MATCHES "${ESC}" OR ERR MATCHES "${ESC}")
    message(FATAL_ERROR "a raw escape character reached the terminal")
  endif()

elseif(SCENARIO STREQUAL "14_stale_temps")
  # Temp files of killed saves were never removed. One of a dead process goes, one of a live
  # process (this test's parent, pid 1 of the namespace: always alive) stays.
  set(dead 4194303)
  if(EXISTS /proc/${dead})
    message(FATAL_ERROR "pid ${dead} is alive here; pick another dead pid for this test")
  endif()
  file(WRITE ${WORK}/.c.ckpt.tmp.${dead}.0 "left by a killed save")
  file(WRITE ${WORK}/.c.ckpt.tmp.1.0 "a save in progress")
  file(WRITE ${WORK}/.other.ckpt.tmp.${dead}.0 "another file's")
  run_cli(0 "fingerprint" ${RUN} --checkpoint ${WORK}/c.ckpt)
  if(EXISTS ${WORK}/.c.ckpt.tmp.${dead}.0)
    message(FATAL_ERROR "the stale temporary file of a dead process was not removed")
  endif()
  if(NOT EXISTS ${WORK}/.c.ckpt.tmp.1.0 OR NOT EXISTS ${WORK}/.other.ckpt.tmp.${dead}.0)
    message(FATAL_ERROR "a temporary file that is not a stale one of this name was removed")
  endif()

elseif(SCENARIO STREQUAL "15_exit3")
  # Disk full / I/O errors during a save exited 2 ("bad input"). A file-size limit makes the
  # write fail mid-save (EFBIG; SIGXFSZ ignored so that write() returns the error).
  run_cli(0 "fingerprint" ${RUN} --checkpoint ${WORK}/c.ckpt)
  file(SHA256 ${WORK}/c.ckpt before)
  string(REPLACE ";" "|" run_words "${RUN}")
  foreach(cmd "${run_words}|--checkpoint|${WORK}/c.ckpt" "replay|${CASE}|--out|${WORK}/r.safetensors")
    string(REPLACE "|" ";" cmd "${cmd}")
    execute_process(COMMAND sh -c "trap '' XFSZ; ulimit -f 1; exec \"$0\" \"$@\"" ${CLI} ${cmd}
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 30)
    string(REPLACE ";" " " shown "${cmd}")
    if(NOT rc EQUAL 3 OR NOT err MATCHES "renaissance: error: cannot save [^\n]*File too large[^\n]*\n$")
      message(FATAL_ERROR "${shown} under a 1 KB file-size limit: expected exit 3, got '${rc}': ${err}")
    endif()
    message("ok (3): ${shown}\n   ${err}")
  endforeach()
  file(SHA256 ${WORK}/c.ckpt after)
  must_equal("${after}" "${before}" "the previous checkpoint after a failed save")

else()
  message(FATAL_ERROR "unknown SCENARIO '${SCENARIO}'")
endif()
