#!/usr/bin/env bash
# The GPU machine's one script: every check and measurement that needs a CUDA device, by phase,
# over ONE CUDA build directory. Phases run in the order given; each has its own time limit, so
# that one call of the device tool (10 minutes at most) runs what fits and a later call on the
# still-warm machine reuses the build.
#
#   scripts/gpu.sh PHASE[:ARG,ARG...]...        scripts/gpu.sh --help        scripts/gpu.sh --digest
#
# The lead runs it through the device tool with carry [".deps"] (scripts/make_gpu_deps.sh
# assembles .deps/: the GPU machine has no Highway, xxHash, CLI11 or nlohmann-json), e.g.
#   bash scripts/gpu.sh build conformance test python
#
# An ARG list after a colon narrows a phase (`test:unit,cli`, `python:test_torch_cuda.py`); the
# environment variables below tune it. Phases:
#   build        configure $BUILD (Release, CUDA on, deps from .deps/ through -DRENAISSANCE_DEPS_DIR)
#                and build everything, or only the targets named as ARGs or in BUILD_TARGETS
#                (space-separated). MPI / NCCL (AUTO, ON, OFF; default AUTO) and NCCL_ROOT (a
#                non-system NCCL) pick the communicators; PYTHON_EXT=build also builds the Python
#                extension here (see python; RENAISSANCE_BUILD_PYTHON makes MPI's AUTO mean OFF,
#                so give MPI=ON for the dist phase in the same build). Source files whose contents
#                differ from the last whole build's are touched first, so that a re-synced tree
#                with older file times is still rebuilt.
#   test         ctest, the whole suite; ARGs are ctest labels, run as `ctest -L '^(A|B)$'`
#                (labels: unit, conformance, cli, hostile, dist). CTEST_ARGS: extra ctest
#                arguments (e.g. "-LE conformance" beside the conformance phase); CTEST_PARALLEL
#                (default 4: the tests share one GPU). Fails if a CUDA test was skipped (no device).
#   conformance  the conformance suite, CPU == CUDA == golden fingerprints: the Golden checks and
#                the Small tier by default; ARGs pick tiers (small big drift audit golden cuda
#                targets selftest_guards, as in conformance/CMakeLists.txt). Fails on any skip.
#   sanitize     compute-sanitizer on the CUDA tests of renaissance_tests: memcheck (the CUDA
#                cases, Newton-Schulz's and the exact products' among them, but the >2^31 tensor
#                and the resnet50 layout) and racecheck (the kernels with shared memory); ARGs:
#                memcheck, racecheck (default both).
#   python       `pip install .` with CUDA (no network, no build isolation; nanobind and
#                scikit-build-core from the machine) into $BUILD-python/site, then pytest on the
#                WHOLE tests/python directory, then the one-rank NCCL smoke scripts
#                (tests/python/*_cuda_smoke.py) and a run recorded on the GPU with None gradients
#                (scripts/record_torch_case.py --device cuda --freeze-alternate) replayed by the
#                CLI on the CPU, when $BUILD has the CLI. ARGs: test files or folders under
#                tests/python, run instead of the whole folder (no smokes, no recording), or one
#                ARG @I/N: part I of N of the folder's test files (every N-th from the I-th of the
#                multi-process *dist* files, then of the others, each sorted, so the slow ones
#                spread over the parts; the smokes and the recording run with part N). The whole
#                folder takes ~640 s on the GPU host (its multi-process tests ~12 s each, ~1 s on
#                the dev VM): two calls, @1/2 and @2/2.
#                PYTEST_ARGS: extra pytest arguments (e.g. "-k cuda"). PYTHON_EXT=build: take
#                the extension from $BUILD (built by the build phase) instead of pip, so the
#                library is compiled once. PYTHON_CUDA=OFF: a dry run without a GPU (CPU
#                extension, the CUDA tests skip); PYTHON: the interpreter (default python3).
#   wheel        a wheel that stands alone: `pip wheel .` with CUDA (no network, no build isolation;
#                the build tree of the python phase, $BUILD-python/skbuild, so after it only the
#                packing runs) into $BUILD-wheel/dist, installed into a fresh venv
#                (--system-site-packages: torch and numpy from the machine), then, with
#                LD_LIBRARY_PATH unset (this machine has no Highway but .deps/), from outside the
#                source tree: import renaissance and renaissance.torch, one CUDA AdamW step
#                against torch.optim.AdamW's, and tests/python/test_wheel.py (ldd of the installed
#                extension, its RUNPATH, a moved copy). Prints 'wheel: import ok ...'.
#   torchbench   against torch, through the installed package (run python first) and bench_step:
#                ARGs precision (bench/bench_torch_precision.py: AdamW with bf16 parameters and
#                fp32 masters, torch's best ways against bench_step --precision bf16) and step
#                (bench/bench_torch_step.py --phases --profile --bench-step: the step inside a
#                training step, the whole iteration by phase, the targets' table); default both.
#   torchsuite   PyTorch's own optimizer tests against the package: TestOptimRenewed of torch's
#                test/test_optim.py (.deps/torch_suite/test_optim.py, not in the repository: docs/python.md
#                says where it comes from; TORCHSUITE_FILE another path) with renaissance.torch's SGD, Adam
#                and AdamW swapped into optim_db, beside the same file with torch's own classes, through
#                tests/torch_suite/run_torch_optim_suite.py. expecttest (torch's test material needs it;
#                not on the machine) is installed from .deps/wheels. Installs the package as the python
#                phase does when no python phase ran before. ARGs: cpu and/or cuda (default both); per
#                device the reference run, then ours against it, each cut at TORCHSUITE_RUN_LIMIT seconds
#                (default 125; a cut run still counts the tests it ran). TORCHSUITE_K: a pytest -k
#                subset. Junit files in $PYBUILD/torchsuite, the summaries in $OUT/torchsuite.json.
#   bench        bench_step on CUDA (CUDA events; ms per step, share of the same-traffic floor).
#                ARGs: step (default: resnet50 and gpt2_small, adamw, sgd_momentum and lars),
#                precision (adamw fp32 and the bf16/fp16 model copy, nearest and stochastic,
#                fp32 and model-dtype gradients, the tensor mask; stochastic / nearest ratios),
#                mask (adamw with the check, --tensor-mask none / clear / set, interleaved rounds),
#                cpu (the CPU step at 2, 4, 8 and 16 threads, bf16/fp16 model copy),
#                muon (bench/bench_torch_muon.py: Muon against torch.optim.Muon + fused AdamW and the
#                batched bf16 GEMMs on gpt2_small, bert_base, resnet50; MUON_MODES picks ours, default
#                exact,exact+batches,fast+batches; each of ours also split by phase, bench_step
#                --muon-phases, in tables after the main one; then the CPU at 16 and 2 threads, with
#                RENAISSANCE_CPU_AMX=0 as well where the host has AMX-INT8).
#   compare      the side-by-side benchmark against torch: bench/check_torch_lars.py, then
#                bench/compare_torch.py (resnet50, bert_base, gpt2_small, every kind; the CPU rows)
#                into $OUT/compare.json, RESULTS.md and results.png (re-rendered from the JSON if
#                the run is cut short). It does not touch bench/RESULTS.md: the lead renders that
#                with `python3 bench/compare_torch.py --from-json gpu-out/compare.json`.
#                COMPARE_ARGS replaces the comparison's layout and replay arguments.
#   ab           bench_step A/B against a base tree, side by side in one call: AB_BASE (default
#                .deps/ab-base.tar, a `git archive` of the base commit that
#                `AB_BASE=COMMIT scripts/make_gpu_deps.sh` writes) is unpacked and its bench_step
#                built in $BUILD-base (once; the same deps), then bench/step_ab.py runs the base and
#                this build's bench_step in AB_ROUNDS (default 3) interleaved rounds. ARGs: cuda
#                and/or cpu (default cuda), or build: only build the base (e.g. in the background
#                of the build phase, whose longest nvcc compiles leave most cores idle). AB_LAYOUTS (resnet50,gpt2_small), AB_KINDS
#                (adamw,sgd_momentum,lars), AB_CONFIGS (fp32,bf16), AB_THREADS (cpu; 16). AB_ROWS=compare:
#                instead, the rows of bench/compare_torch.py with its command lines (every kind but
#                muon and adamw+clip, resnet50, bert_base and gpt2_small, both timing methods on cuda;
#                adamw and sgd_momentum on cpu), AB_LAYOUTS / AB_KINDS narrowing them. The base's CLI
#                is not built: the kind table comes from this build's. A cut run prints the finished
#                rounds (bench/step_ab.py saves its JSON after every round). The result line gives
#                the ratios' spread and the outer ends of their 95 % bootstrap intervals.
#   golden       re-records audit/golden/fingerprints.json and conformance/REPORT.md
#                (scripts/record_golden.sh on $BUILD) and copies both to $OUT (review, commit).
#   cli          the CLI on the CUDA backend: every testdata/replay and testdata/recorded case
#                replayed on cuda, `renaissance audit`, runs with --nan-at, and CPU == CUDA run
#                fingerprints of the model copy (bf16/fp16, nearest/stochastic, model-dtype
#                gradients; resnet50 and an odd layout whose tensors cut 8-element blocks, also
#                with --simulate-ranks).
#   dist         CUDA ranks over NCCL (needs a build with MPI and NCCL: MPI=ON NCCL=ON build).
#                ARGs: checks (mpirun -np K ... --distributed nccl: replicated == the plain CUDA
#                run, ordered == --simulate-ranks K, fast == ordered at K = 2; with the bf16/fp16
#                model copy and model-dtype gradients; kinds adamw lamb lars muon), mask
#                (tests/comm/sharded_mask on cuda ranks, Muon among its kinds), perf (ms per step
#                and comm_ms_per_step); default all three. KS: the rank counts (default "1 2"
#                with two GPUs or more, else "1"); MODELS, KINDS, PRECS ("|"-separated
#                --precision values), PERF_MODELS, PERF_STEPS.
#
# Every phase writes one log, $OUT/PHASE.log (OUT, default gpu-out/); the device tool brings back
# at most 8 files from $OUT, so choose phases accordingly (compare adds 3 files, golden 2, torchsuite 1,
# torchbench 2). A phase's limit is TIMEOUT_PHASE (e.g. TIMEOUT_TEST=400; defaults in
# DEFAULT_LIMIT below). BUILD: the build directory (default build-gpu). The last lines printed are
# a table: phase, status (ok, FAILED, SKIPPED), seconds, one line of result. A failing phase makes
# the exit status 1, later phases still run, except that those needing the build are SKIPPED
# when the build phase of the same call failed. A usage error exits 2.
# shellcheck disable=SC2317  # the phase_* functions are called by name ("phase_$name")
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
SELF=$ROOT/scripts/gpu.sh
abs() { case $1 in /*) echo "$1" ;; *) echo "$ROOT/$1" ;; esac; }
OUT=$(abs "${OUT:-gpu-out}")
BUILD=$(abs "${BUILD:-build-gpu}")
PYBUILD=$BUILD-python
PYSITE=$PYBUILD/site
DEPS=$ROOT/.deps
PY=$(command -v "${PYTHON:-python3}" || echo "${PYTHON:-python3}")
export LD_LIBRARY_PATH="$DEPS/lib:$DEPS/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
RESULT_FILE=${RESULT_FILE:-/dev/null}  # where a phase leaves its one-line result for the table

PHASES=(build test conformance sanitize python wheel torchbench torchsuite bench ab compare golden cli dist)
declare -A DEFAULT_LIMIT=([build]=300 [test]=300 [conformance]=240 [sanitize]=270 [python]=540 [wheel]=480
  [torchbench]=480 [torchsuite]=560 [bench]=300 [ab]=540 [compare]=420 [golden]=400 [cli]=240 [dist]=540)

usage() {
  sed -n '2,/^# shellcheck disable=SC2317/p' "$SELF" | sed '$d' | sed 's/^# \{0,1\}//'
}

# ---- helpers for the phases (each phase runs as `gpu.sh --phase NAME ARGS...`) ----
result() { printf '%s\n' "$*" > "$RESULT_FILE"; echo "RESULT: $*"; }
need() {  # need FILE WHAT: fail the phase unless FILE exists
  [ -e "$1" ] && return 0
  result "no $2 at $1 (run the build phase; BUILD_TARGETS may have left it out)"
  exit 1
}
gtest_line() { grep -E '^\[  (PASSED|FAILED)  \]' "$1" | head -2 | tr '\n' ' ' | sed 's/ *$//'; }
last_json() { "$PY" -c 'import json,sys
lines = [l for l in sys.stdin.read().splitlines() if l.startswith("{")]
print(json.loads(lines[-1])[sys.argv[1]] if lines else "")' "$1"; }
join_by() { local IFS=$1; shift; echo "$*"; }

# The source files (paths from $ROOT, sorted) and each one's SHA-256, as `sha256sum` prints them;
# the digest: sha256 over those lines (path and content of each), in that order.
source_hashes() {
  (cd "$ROOT" && find core runtime backend_cpu backend_cuda audit comm cli python tools tests conformance bench fuzz \
      -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name '*.py' -o -name '*.cmake' \
      -o -name CMakeLists.txt \) -not -path '*/__pycache__/*' -print 2>/dev/null | LC_ALL=C sort | xargs sha256sum)
}
source_digest() { source_hashes | sha256sum | cut -c1-16; }

phase_build() {
  local targets=("$@") cfg out rc
  [ ${#targets[@]} -eq 0 ] && read -ra targets <<< "${BUILD_TARGETS:-}"
  cfg=(-S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON
       -DRENAISSANCE_MPI="${MPI:-AUTO}" -DRENAISSANCE_NCCL="${NCCL:-AUTO}")
  [ -d "$DEPS" ] && cfg+=(-DRENAISSANCE_DEPS_DIR="$DEPS" -DCMAKE_PREFIX_PATH="$DEPS")
  [ -n "${NCCL_ROOT:-}" ] && cfg+=(-DNCCL_ROOT="$NCCL_ROOT")
  if [ "${PYTHON_EXT:-pip}" = build ]; then
    cfg+=(-DRENAISSANCE_BUILD_PYTHON=ON -DPython_EXECUTABLE="$PY")
    [ ${#targets[@]} -gt 0 ] && targets+=(_core)
  else
    cfg+=(-DRENAISSANCE_BUILD_PYTHON=OFF)
  fi
  out=$(cmake "${cfg[@]}" 2>&1)
  rc=$?
  echo "$out"
  if [ "$rc" -ne 0 ]; then
    result "configure failed (rc $rc): $(grep -m1 -E 'Error' <<< "$out")"
    return 1
  fi
  freshen_sources
  local what
  what=$(grep -E 'Renaissance (CUDA backend|MPI communicator|NCCL communicator):' <<< "$out" |
         sed -E 's/.*Renaissance ([A-Za-z]+)[^:]*: /\1 /' | tr '\n' ',' | sed 's/,$//; s/,/, /g')
  ninja -C "$BUILD" -j"$(nproc)" "${targets[@]}" 2>&1 | tee "$BUILD/gpu-build-output.txt"
  rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "== the first errors"
    grep -E 'error|FAILED' "$BUILD/gpu-build-output.txt" | head -30
    result "ninja failed (rc $rc): $(grep -m1 -E 'error' "$BUILD/gpu-build-output.txt" | cut -c1-140)"
    return 1
  fi
  [ ${#targets[@]} -eq 0 ] && source_hashes > "$BUILD/gpu-sources.sha256"
  result "$what; built ${targets[*]:-everything}"
}

# ninja rebuilds what is older than its sources, but the device tool's copy of the tree may give a
# changed file an older time than the objects a previous call built from it (a warm machine, another
# branch): the files whose contents differ from those of the last whole build
# ($BUILD/gpu-sources.sha256) are touched, so that ninja rebuilds them whatever their times.
freshen_sources() {
  local manifest=$BUILD/gpu-sources.sha256 changed
  [ -f "$manifest" ] || return 0
  changed=$(cd "$ROOT" && sha256sum --check --quiet "$manifest" 2>/dev/null | sed -n 's/: FAILED$//p')
  [ -z "$changed" ] && return 0
  echo "== $(wc -l <<< "$changed") source files differ from the last whole build's; touched for ninja:"
  echo "$changed" | head -20
  (cd "$ROOT" && xargs -d '\n' touch <<< "$changed")
}

phase_test() {
  need "$BUILD/CTestTestfile.cmake" "CMake build"
  local args=(--test-dir "$BUILD" --output-on-failure --no-tests=error --parallel "${CTEST_PARALLEL:-4}")
  [ $# -gt 0 ] && args+=(-L "^($(join_by '|' "$@"))\$")
  local log=$BUILD/gpu-ctest-output.txt rc
  # shellcheck disable=SC2086  # CTEST_ARGS is a list of arguments
  ctest "${args[@]}" ${CTEST_ARGS:-} 2>&1 | tee "$log"
  rc=$?
  local line skipped cuda_skipped
  line=$(grep -E 'tests passed|tests failed' "$log" | tail -1)
  skipped=$(grep -cE 'Test +#[0-9]+: .*Skipped' "$log")
  cuda_skipped=$(grep -E 'Test +#[0-9]+: .*Skipped' "$log" | grep -ci cuda)
  echo "== skipped entries"
  grep -E 'Test +#[0-9]+: .*Skipped' "$log"
  if [ "$cuda_skipped" -gt 0 ] && [ "$rc" -eq 0 ]; then
    echo "FAIL: $cuda_skipped CUDA test(s) skipped: no CUDA device?"
    rc=1
  fi
  result "${line:-no ctest summary}; $skipped skipped ($cuda_skipped CUDA)$([ $# -gt 0 ] && echo "; labels $*")"
  return "$rc"
}

phase_conformance() {
  local conf=$BUILD/conformance/conformance_suite tiers=("$@") filter=() t log rc
  need "$conf" "conformance suite"
  [ ${#tiers[@]} -eq 0 ] && tiers=(golden small)
  for t in "${tiers[@]}"; do
    case $t in
      small | big | drift | audit) filter+=("${t^}/*") ;;
      golden) filter+=("Golden.*") ;;
      cuda) filter+=("Cuda.*") ;;
      targets) filter+=("HighwayTargets.*") ;;
      selftest_guards) filter+=("GuardSelfTest.*") ;;
      *) result "unknown conformance tier $t"; return 2 ;;
    esac
  done
  log=$BUILD/gpu-conformance-output.txt
  "$conf" --gtest_filter="$(join_by : "${filter[@]}")" 2>&1 | tee "$log"
  rc=$?
  local skipped
  skipped=$(grep -cE '^\[  SKIPPED \] [A-Z]' "$log")
  if [ "$skipped" -gt 0 ] && [ "$rc" -eq 0 ]; then
    echo "FAIL: $skipped test(s) skipped: the CUDA comparisons did not run"
    rc=1
  fi
  result "$(join_by : "${filter[@]}"): $(gtest_line "$log"); $skipped skipped"
  return "$rc"
}

phase_sanitize() {
  local tests=$BUILD/tests/renaissance_tests tools=("$@") rc=0 r line=() t0
  need "$tests" "renaissance_tests"
  command -v compute-sanitizer > /dev/null || { result "no compute-sanitizer on PATH"; return 1; }
  [ ${#tools[@]} -eq 0 ] && tools=(memcheck racecheck)
  local cuda='CudaBackend.*:AllKinds/CudaMatchesCpu.*:NewtonSchulzCuda.*:ExactMatmulCuda.*' filter log
  for tool in "${tools[@]}"; do
    case $tool in
      # The >2^31 tensor and the resnet50 layout test sizes, not memory safety, and take minutes
      # under the sanitizer.
      memcheck) filter="$cuda:-CudaBackend.TensorOfMoreThan2To31Elements:AllKinds/CudaMatchesCpu.Resnet50Layout/*" ;;
      # The kernels with shared memory: LARS norms and ratios, the check's block vote, Muon's
      # norm tiles, slab tiles and column digits.
      racecheck) filter='AllKinds/CudaMatchesCpu.OddSizes*/lars*:AllKinds/CudaMatchesCpu.HundredsOfTinyTensors/lars:CudaBackend.GraphReplayEqualsDirectExecution:CudaBackend.MuonBatchesGiveTheCpuBits:NewtonSchulzCuda.Batched*:ExactMatmulCuda.StridedViewsEqualTheReference' ;;
      *) result "unknown sanitizer tool $tool"; return 2 ;;
    esac
    log=$BUILD/gpu-$tool-output.txt
    t0=$SECONDS
    echo "== compute-sanitizer --tool $tool, --gtest_filter=$filter"
    compute-sanitizer --tool "$tool" --error-exitcode 3 "$tests" --gtest_filter="$filter" 2>&1 | tee "$log"
    r=$?
    [ "$r" -ne 0 ] && rc=1
    line+=("$tool rc $r in $((SECONDS - t0)) s: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$log" | tail -1) $(gtest_line "$log")")
  done
  result "$(join_by ';' "${line[@]}")"
  return "$rc"
}

# The Python package: pip (default) or the extension of $BUILD, laid out as pip lays it out.
python_install() {
  if [ "${PYTHON_EXT:-pip}" = build ]; then
    need "$BUILD/build.ninja" "CMake build"
    freshen_sources; ninja -C "$BUILD" _core || { echo "no _core target? build with PYTHON_EXT=build"; return 1; }
    rm -rf "$PYSITE" && mkdir -p "$PYSITE/renaissance" &&
      cp "$ROOT"/python/renaissance/*.py "$PYSITE/renaissance/" &&
      cp "$BUILD"/python/_core*.so "$PYSITE/renaissance/" &&
      # The libraries bundled beside the extension (Highway; python/CMakeLists.txt), if any.
      find "$BUILD/python" -maxdepth 1 -name 'lib*.so*' -exec cp {} "$PYSITE/renaissance/" \;
    return
  fi
  mkdir -p "$PYBUILD"
  # scikit-build-core reads its settings from the environment too (older pips lack -C).
  SKBUILD_BUILD_DIR="$PYBUILD/skbuild" \
  SKBUILD_CMAKE_DEFINE="RENAISSANCE_CUDA=${PYTHON_CUDA:-ON};RENAISSANCE_DEPS_DIR=$DEPS;CMAKE_PREFIX_PATH=$DEPS" \
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    "$PY" -m pip install --no-build-isolation --no-deps --no-index --upgrade --target "$PYSITE" "$ROOT"
}

phase_python() {
  local t0=$SECONDS rc extras=()
  echo "== install ($([ "${PYTHON_EXT:-pip}" = build ] && echo "from $BUILD" || echo pip) into $PYSITE)"
  if ! python_install; then
    result "install FAILED after $((SECONDS - t0)) s"
    return 1
  fi
  local install_s=$((SECONDS - t0))
  export PYTHONPATH=$PYSITE
  # The multi-process tests run 2-3 ranks, each with its own OpenMP team: passive waits, as
  # scripts/test.sh says why.
  export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
  cd "$PYBUILD" || return 1  # outside the source tree: `import renaissance` is the installed one
  "$PY" -c 'import renaissance, torch; print("renaissance", renaissance.__version__, "with_cuda", renaissance.with_cuda,
"torch", torch.__version__, "cuda available", torch.cuda.is_available())' || { result "import failed"; return 1; }
  if [ "${PYTHON_CUDA:-ON}" = ON ] &&
     ! "$PY" -c 'import renaissance, torch, sys; sys.exit(0 if renaissance.with_cuda and torch.cuda.is_available() else 1)'; then
    result "no CUDA: the package has no CUDA backend or torch sees no device (the CUDA tests would skip)"
    return 1
  fi
  local files=() f part=0 parts=0 i=0 whole=0
  if [ $# -eq 1 ] && [[ "$1" =~ ^@([0-9]+)/([0-9]+)$ ]]; then
    part=${BASH_REMATCH[1]} parts=${BASH_REMATCH[2]}
    if [ "$part" -lt 1 ] || [ "$part" -gt "$parts" ]; then result "no part $1 (parts are @1/N to @N/N)"; return 2; fi
    # The multi-process files (*dist*) first, then the rest, each sorted: round-robin then
    # balances the slow ones.
    local ordered=("$ROOT"/tests/python/test_*dist*.py)
    for f in "$ROOT"/tests/python/test_*.py; do [[ "$(basename "$f")" == *dist* ]] || ordered+=("$f"); done
    for f in "${ordered[@]}"; do
      [ $((i % parts + 1)) -eq "$part" ] && files+=("$f")
      i=$((i + 1))
    done
    [ "$part" -eq "$parts" ] && whole=1
  else
    for f in "$@"; do files+=("$ROOT/tests/python/$f"); done
    [ ${#files[@]} -eq 0 ] && files=("$ROOT/tests/python") && whole=1
  fi
  echo "== pytest ${files[*]#"$ROOT/"}"
  # pytest gets SIGINT before the phase's limit (PHASE_LIMIT, from the parent), leaving 45 s, or
  # 150 s when the smokes and the recording follow (~40 s on the H100 machine): a cut
  # run still prints its counts and --durations (the slowest tests by name, where the time went);
  # one file per line with its dots (no -q) says how far it came.
  local left=$(( ${PHASE_LIMIT:-540} - (SECONDS - t0) - (whole ? 150 : 45) ))
  [ "$left" -lt 30 ] && left=30
  # shellcheck disable=SC2086  # PYTEST_ARGS is a list of arguments
  timeout -s INT -k 20 "$left" "$PY" -m pytest -rs -p no:cacheprovider --durations=25 "${files[@]}" ${PYTEST_ARGS:-} 2>&1 |
    tee "$PYBUILD/gpu-pytest-output.txt"
  rc=$?
  local summary cut=""
  summary=$(grep -E '(passed|failed|error|skipped)' "$PYBUILD/gpu-pytest-output.txt" | tail -1 | tr -d '=' | sed 's/^ *//')
  if [ "$rc" -eq 124 ]; then  # not the phase's own timeout (the parent reads 124 as that)
    echo "== pytest cut after $left s (SIGINT): the counts above are of the tests that ran"
    cut="CUT after $left s: "
    rc=1
  fi
  if [ "$whole" -eq 1 ] && [ "${PYTHON_CUDA:-ON}" = ON ]; then
    # Not collected by pytest (no test_ prefix): one-rank NCCL process groups on the GPU.
    for f in "$ROOT"/tests/python/*_cuda_smoke.py; do
      echo "== $(basename "$f")"
      if "$PY" "$f"; then extras+=("$(basename "$f" .py) ok"); else extras+=("$(basename "$f" .py) FAILED"); rc=1; fi
    done
    # A run with None gradients recorded on the GPU must replay on the CPU backend: MATCH.
    local cli=$BUILD/cli/renaissance case=$PYBUILD/torch_adamw_frozen_cuda
    if [ -x "$cli" ]; then
      echo "== recorded on cuda (--freeze-alternate), replayed on cpu"
      rm -rf "$case"
      if "$PY" "$ROOT/scripts/record_torch_case.py" --out "$case" --device cuda --freeze-alternate &&
         "$cli" replay "$case" --backend cpu; then
        extras+=("cuda recording replays on cpu")
      else
        extras+=("cuda recording replay FAILED"); rc=1
      fi
    else
      extras+=("(no CLI in $BUILD: no cuda recording)")
    fi
  fi
  result "install ${install_s} s; pytest: ${cut}${summary:-no summary}$([ ${#extras[@]} -gt 0 ] && echo "; $(join_by ';' "${extras[@]}")")"
  return "$rc"
}

phase_wheel() {
  local t0=$SECONDS wdir=$BUILD-wheel venv whl pip_venv rc
  venv=$wdir/venv
  # Built without .deps/ on the loader's path: CMake finds Highway through RENAISSANCE_DEPS_DIR.
  LD_LIBRARY_PATH=$(tr ':' '\n' <<< "${LD_LIBRARY_PATH:-}" | grep -v "^$DEPS/" | grep -v '^$' | paste -sd:)
  export LD_LIBRARY_PATH
  rm -rf "$wdir/dist" && mkdir -p "$wdir/dist" "$PYBUILD"
  echo "== pip wheel (CUDA ${PYTHON_CUDA:-ON}, build tree $PYBUILD/skbuild) into $wdir/dist"
  if ! SKBUILD_BUILD_DIR="$PYBUILD/skbuild" \
       SKBUILD_CMAKE_DEFINE="RENAISSANCE_CUDA=${PYTHON_CUDA:-ON};RENAISSANCE_DEPS_DIR=$DEPS;CMAKE_PREFIX_PATH=$DEPS" \
       CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
       "$PY" -m pip wheel --no-build-isolation --no-deps --no-index -w "$wdir/dist" "$ROOT"; then
    result "pip wheel FAILED after $((SECONDS - t0)) s"
    return 1
  fi
  whl=$(ls "$wdir"/dist/renaissance-*.whl)
  local build_s=$((SECONDS - t0))
  "$PY" -c 'import sys, zipfile; print("\n".join(n for n in zipfile.ZipFile(sys.argv[1]).namelist() if "dist-info" not in n))' "$whl"
  unset LD_LIBRARY_PATH
  echo "== a fresh venv (--system-site-packages), LD_LIBRARY_PATH unset"
  rm -rf "$venv"
  # Without ensurepip (a distribution's python without its venv package) the machine's pip
  # installs into the venv through --python.
  if "$PY" -m venv --system-site-packages "$venv" 2> /dev/null; then
    pip_venv=("$venv/bin/python" -m pip)
  else
    rm -rf "$venv"
    "$PY" -m venv --system-site-packages --without-pip "$venv" || { result "venv FAILED"; return 1; }
    pip_venv=("$PY" -m pip --python "$venv/bin/python")
  fi
  # Where the machine's python is itself a venv (torch in /opt/torch/.venv), --system-site-packages
  # reaches only its base interpreter's packages: a .pth file adds the machine's site-packages
  # after the fresh venv's own, so torch and numpy are the machine's and renaissance the wheel's.
  "$PY" -c 'import site, sys; sys.exit(0 if sys.prefix != sys.base_prefix else 1)' &&
    "$PY" -c 'import site; print("\n".join(site.getsitepackages()))' > \
      "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/machine-site.pth"
  # --no-index: numpy, the one dependency, must be satisfied by the machine's own.
  "${pip_venv[@]}" install --no-index "$whl" || { result "pip install of $(basename "$whl") FAILED"; return 1; }
  cd "$wdir" || return 1  # outside the source tree: `import renaissance` is the installed one
  "$venv/bin/python" - "$whl" "${PYTHON_CUDA:-ON}" <<'PY' 2>&1 | tee "$wdir/wheel-check.txt"
import os, sys
import torch
import renaissance, renaissance.torch as rt
whl, cuda = sys.argv[1], sys.argv[2] == "ON"
pkg = os.path.dirname(renaissance.__file__)
assert pkg.startswith(sys.prefix), f"renaissance imported from {pkg}, not the venv {sys.prefix}"
assert "LD_LIBRARY_PATH" not in os.environ
dev = "cuda" if cuda else "cpu"
assert renaissance.with_cuda == cuda and (not cuda or torch.cuda.is_available()), (renaissance.with_cuda, torch.cuda.is_available())
torch.manual_seed(0)
w0 = torch.randn(37, 5, device=dev)
g = torch.randn(37, 5, device=dev)
ours, ref = w0.clone().requires_grad_(), w0.clone().requires_grad_()
for p, opt in ((ours, rt.AdamW([ours], lr=1e-2, weight_decay=0.01)), (ref, torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.01))):
    p.grad = g.clone()
    opt.step()
diff = (ours - ref).abs().max().item()
assert diff <= 1e-6, f"one AdamW step differs from torch's by {diff}"
bundled = sorted(f for f in os.listdir(pkg) if ".so" in f)
# With torch's libraries loaded too, every Highway in the process is the package's own.
hwy = sorted({l.split()[5] for l in open("/proc/self/maps") if len(l.split()) >= 6 and "libhwy" in l.split()[5]})
assert hwy and all(os.path.dirname(os.path.realpath(h)) == os.path.realpath(pkg) for h in hwy), f"Highway mapped from {hwy}, not from {pkg}"
print(f"wheel: import ok {os.path.basename(whl)} ({os.path.getsize(whl) // 1024} KiB), renaissance "
      f"{renaissance.__version__} with_cuda {renaissance.with_cuda}, torch {torch.__version__}, one {dev} AdamW "
      f"step max|ours - torch| {diff:.1e}; package .so files {bundled}; LD_LIBRARY_PATH unset")
PY
  rc=${PIPESTATUS[0]}
  local line
  line=$(grep -m1 '^wheel: ' "$wdir/wheel-check.txt")
  echo "== tests/python/test_wheel.py on the installed wheel"
  "$venv/bin/python" -m pytest -q -p no:cacheprovider "$ROOT/tests/python/test_wheel.py" 2>&1 | tee "$wdir/wheel-pytest.txt"
  [ "${PIPESTATUS[0]}" -ne 0 ] && rc=1
  result "build ${build_s} s; ${line:-no import line (see the log)}; test_wheel.py: $(grep -E '(passed|failed|error)' "$wdir/wheel-pytest.txt" | tail -1 | tr -d '=' | sed 's/^ *//')"
  return "$rc"
}

phase_torchbench() {
  local bench=$BUILD/bench/bench_step parts=("$@") rc=0 r line=() quick=()
  need "$bench" "bench_step"
  need "$PYSITE/renaissance" "installed package (run the python phase first)"
  export PYTHONPATH=$PYSITE PYTHONUNBUFFERED=1
  [ "${PYTHON_CUDA:-ON}" = ON ] || quick=(--quick)
  [ ${#parts[@]} -eq 0 ] && parts=(precision step)
  for p in "${parts[@]}"; do
    case $p in
      precision)
        "$PY" "$ROOT/bench/bench_torch_precision.py" --build "$BUILD" --rounds 2 --replays 100 \
          --layouts resnet50,bert_base,gpt2_small --json-out "$OUT/torch_precision.json" "${quick[@]}"
        r=$?
        [ -s "$OUT/torch_precision.json" ] && "$PY" "$ROOT/bench/bench_torch_precision.py" --from-json "$OUT/torch_precision.json"
        ;;
      step)
        # The JSON is written after each model, so a cut keeps the models measured.
        "$PY" "$ROOT/bench/bench_torch_step.py" --phases --profile --rounds 4 --phase-iters 10 \
          --phase-models resnet50,gpt2_small,resnet50:64 --bench-step "$bench" \
          --json-out "$OUT/torch_step.json" "${quick[@]}" 2>&1 | tee "$BUILD/gpu-torch-step-output.txt"
        r=$?
        local verdict
        verdict=$(grep -oE 'bench_torch_step: (SUCCESS|NOT MET)' "$BUILD/gpu-torch-step-output.txt" | tail -1)
        p="step${verdict:+ (${verdict#bench_torch_step: })}"
        ;;
      *) result "unknown torchbench part $p"; return 2 ;;
    esac
    [ "$r" -ne 0 ] && rc=1
    line+=("$p rc $r")
  done
  result "$(join_by ';' "${line[@]}") (JSON in $OUT)"
  return "$rc"
}

phase_torchsuite() {
  local devices=("$@") dev r rc=0 pairs=() dir=$PYBUILD/torchsuite
  local suite=$ROOT/tests/torch_suite/run_torch_optim_suite.py file=${TORCHSUITE_FILE:-$DEPS/torch_suite/test_optim.py}
  local limit=${TORCHSUITE_RUN_LIMIT:-125} k=()
  need "$file" "torch's test/test_optim.py (docs/python.md: fetched into .deps/torch_suite/)"
  [ ${#devices[@]} -eq 0 ] && devices=(cpu cuda)
  [ -n "${TORCHSUITE_K:-}" ] && k=(-k "$TORCHSUITE_K")
  if [ ! -d "$PYSITE/renaissance" ]; then
    echo "== install the package into $PYSITE (no python phase ran before)"
    python_install || { result "install FAILED"; return 1; }
  fi
  mkdir -p "$dir"
  if ! "$PY" -c 'import expecttest' 2> /dev/null; then
    echo "== expecttest from $DEPS/wheels into $dir/site"
    "$PY" -m pip install --no-index --no-deps --upgrade --target "$dir/site" "$DEPS"/wheels/expecttest-*.whl ||
      { result "no expecttest: pip download expecttest -d .deps/wheels on the dev machine"; return 1; }
  fi
  export PYTHONPATH=$PYSITE:$dir/site PYTHONUNBUFFERED=1
  cd "$dir" || return 1  # outside the source tree: `import renaissance` is the installed one
  for dev in "${devices[@]}"; do
    rm -f "$dir/ref-$dev.xml" "$dir/ours-$dev.xml"
    echo "== $dev: torch's classes"
    timeout -k 20 "$limit" "$PY" "$suite" run --reference --device "$dev" --test-file "$file" "${k[@]}" \
      --junit "$dir/ref-$dev.xml"
    r=$?
    [ "$r" -eq 0 ] || { echo "(reference run on $dev: rc $r)"; rc=1; }
    echo "== $dev: renaissance.torch's classes"
    timeout -k 20 "$limit" "$PY" "$suite" run --device "$dev" --test-file "$file" "${k[@]}" \
      --junit "$dir/ours-$dev.xml" --against "$dir/ref-$dev.xml"
    r=$?
    [ "$r" -eq 0 ] || { echo "(our run on $dev: rc $r)"; rc=1; }
    pairs+=("$dev:$dir/ref-$dev.xml:$dir/ours-$dev.xml")
  done
  echo "== counts"
  "$PY" "$suite" table --json "$OUT/torchsuite.json" "${pairs[@]}" | tee "$dir/table.txt"
  result "$(grep '^torchsuite: ' "$dir/table.txt" | sed 's/^torchsuite: //')"
  return "$rc"
}

# bench_step rows tagged with the set and round; tables at the end.
bench_rows() {  # bench_rows SET ROUND ARGS...
  local set=$1 round=$2
  shift 2
  "$BUILD/bench/bench_step" "$@" | grep '^{' | sed "s/^{/{\"set\":\"$set\",\"round\":$round,/" | tee -a "$ROWS"
}

phase_bench() {
  need "$BUILD/bench/bench_step" "bench_step"
  local sets=("$@") s round p threads
  [ ${#sets[@]} -eq 0 ] && sets=(step)
  ROWS=$BUILD/gpu-bench-rows.jsonl
  : > "$ROWS"
  for s in "${sets[@]}"; do
    echo "== bench $s"
    case $s in
      step)
        bench_rows step 1 --backend cuda --layouts resnet50,gpt2_small --kinds adamw,sgd_momentum,lars --replays 200 ;;
      precision)
        for round in 1 2; do
          for p in "fp32" "bf16" "bf16 --stochastic-rounding" "fp16" "fp16 --stochastic-rounding" \
                   "bf16 --grad-dtype model" "bf16 --stochastic-rounding --grad-dtype model" \
                   "bf16 --grad-dtype model --tensor-mask clear" "bf16 --stochastic-rounding --grad-dtype model --tensor-mask clear"; do
            # shellcheck disable=SC2086  # p is --precision's value and more flags
            bench_rows precision "$round" --backend cuda --layouts resnet50,bert_base,gpt2_small --kinds adamw \
              --replays 200 --timing enqueued --precision $p
          done
        done ;;
      mask)
        for round in 1 2 3; do  # interleaved: the three variants see the same machine
          for p in none clear set; do
            bench_rows mask "$round" --backend cuda --layouts resnet50,gpt2_small --kinds adamw --check on \
              --replays 200 --timing enqueued --tensor-mask "$p"
          done
        done ;;
      cpu)
        for threads in 2 4 8 16; do
          for p in "bf16" "bf16 --stochastic-rounding" "fp16" "fp16 --stochastic-rounding"; do
            # shellcheck disable=SC2086
            bench_rows cpu 1 --backend cpu --threads "$threads" --layouts resnet50 --kinds adamw --replays 10 \
              --grad-dtype model --precision $p
          done
        done ;;
      muon)
        # Muon's step beside torch.optim.Muon + fused AdamW and the batched bf16 GEMMs, one run
        # (bench/bench_torch_muon.py; its own table, then each of ours by phase: bench_step
        # --muon-phases), then the CPU at 16 and 2 threads: exact mode's products on the AMX tile
        # unit (the default where the host has AMX-INT8) and, on such a host, on the SIMD lanes too.
        "$PY" bench/bench_torch_muon.py --layouts gpt2_small,bert_base,resnet50 --bench-step "$BUILD/bench/bench_step" \
          --muon-modes "${MUON_MODES:-exact,exact+batches,fast+batches}" --phases --json "$OUT/muon_gpu.json"
        for threads in 16 2; do
          for amx in 1 0; do
            if [ "$amx" = 0 ] && ! grep -qw amx_int8 /proc/cpuinfo; then continue; fi
            echo "CPU, $threads threads, RENAISSANCE_CPU_AMX=$amx"
            RENAISSANCE_CPU_AMX=$amx "$PY" bench/bench_torch_muon.py --device cpu --threads "$threads" --layouts gpt2_small \
              --steps 3 --warmup 1 --bench-step "$BUILD/bench/bench_step" --json "$OUT/muon_cpu_${threads}_amx$amx.json"
          done
        done ;;
      *) result "unknown bench set $s"; return 2 ;;
    esac
  done
  echo
  "$PY" - "$ROWS" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
best = {}
for r in rows:  # the fastest round of each configuration
    k = (r["set"], r.get("backend", ""), r["layout"], r["optimizer"], str(r.get("check_finite", "")),
         r.get("precision", "fp32"), r.get("rounding", "nearest"), r.get("grad_dtype", "fp32"),
         r.get("tensor_mask", "none"))
    if k not in best or r["ms_per_step"] < best[k]["ms_per_step"]:
        best[k] = r
print(f'{"set":9} {"backend":24} {"layout":11} {"kind":13} {"check":5} {"copy":15} {"grads":5} {"mask":5} '
      f'{"ms/step":>9} {"floor ms":>9} {"% floor":>7} launches')
for k, r in best.items():
    fl = r.get("floor_ms")
    pct = f'{100 * fl / r["ms_per_step"]:6.1f}%' if fl else f'{100 * r.get("share_of_limit", 0):6.1f}%'
    print(f'{k[0]:9} {k[1]:24} {k[2]:11} {k[3]:13} {k[4]:5} {k[5] + " " + k[6]:15} {k[7]:5} {k[8]:5} '
          f'{r["ms_per_step"]:9.4f} {fl or 0:9.4f} {pct:>7} {r.get("launches_per_step", "")}')
ratios = [(k, r["ms_per_step"] / best[k[:6] + ("nearest",) + k[7:]]["ms_per_step"])
          for k, r in best.items() if k[6] == "stochastic" and k[:6] + ("nearest",) + k[7:] in best]
if ratios:
    print("\nstochastic / nearest (step-time ratio, target <= 1.03 on CUDA):")
    for k, x in ratios:
        flag = "  > 1.03" if k[0] != "cpu" and x > 1.03 else ""
        print(f'  {k[0]:9} {k[2]:11} check={k[4]:5} {k[5]} grads={k[7]} mask={k[8]}: {x:.3f}{flag}')
PY
  # (The muon set writes no bench_step rows: its results are bench_torch_muon.py's JSON files.)
  local muon_files=""
  [[ " ${sets[*]} " == *" muon "* ]] && muon_files=", $(find "$OUT" -maxdepth 1 -name 'muon_*.json' | wc -l) Muon JSON files"
  result "$(join_by ' ' "${sets[@]}"): $(grep -c '^{' "$ROWS") bench_step rows$muon_files (tables in the log)"
}

phase_compare() {
  need "$BUILD/bench/bench_step" "bench_step"
  local rc args
  echo "== bench/check_torch_lars.py (the torch LARS against the float64 replay cases)"
  "$PY" "$ROOT/bench/check_torch_lars.py"
  rc=$?
  local lars="lars check ok"
  [ "$rc" -eq 0 ] || lars="lars check FAILED"
  # Every kind of the table plus adamw+clip; 100 replays per configuration and method where a
  # step takes well under a millisecond, 20 for torch's uncaptured paths; on the CPU 5, against
  # torch's foreach and fused paths. The JSON is written after every row.
  read -ra args <<< "${COMPARE_ARGS:---layouts resnet50,bert_base,gpt2_small --replays 100 --slow-replays 20 --cpu-replays 5 --cpu-impls foreach,fused}"
  echo "== bench/compare_torch.py ${args[*]}"
  PYTHONUNBUFFERED=1 "$PY" "$ROOT/bench/compare_torch.py" --build "$BUILD" "${args[@]}" \
    --json-out "$OUT/compare.json" --out "$OUT/RESULTS.md" --plot "$OUT/results.png" 2>&1 | tee "$BUILD/gpu-compare-output.txt"
  local r=$?
  if [ "$r" -ne 0 ] && [ -s "$OUT/compare.json" ]; then
    "$PY" "$ROOT/bench/compare_torch.py" --from-json "$OUT/compare.json" --out "$OUT/RESULTS.md" --plot "$OUT/results.png"
  fi
  [ -s "$OUT/compare.json" ] && "$PY" - "$OUT/compare.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
def best(paths, m):
    v = [(x[m], k) for k, x in paths.items() if x and x.get(m) is not None]
    return min(v) if v else (None, None)
f = lambda x: "   n/a" if x is None else f"{x:6.3f}"
print(f"{'layout':>10} {'kind':>13} | enqueued ms: ours-on torch-chk  ours-off torch  %floor on/off | synced: ours-off torch")
for g in r["gpu"]:
    on, off = g["ours_checked"].get("enqueued"), g["ours"].get("enqueued")
    tc, t = best(g["torch_checked"], "enqueued")[0], best(g["torch"], "enqueued")[0]
    p = lambda fl, ms: f"{100 * fl / ms:4.0f}%" if fl and ms else "  n/a"
    pct = f"{p(g.get('floor_checked'), on)}/{p(g['floor'], off)}"
    print(f"{g['layout']:>10} {g['kind']:>13} | {f(on)} {f(tc)}   {f(off)} {f(t)} {pct} | "
          f"{f(g['ours'].get('synced'))} {f(best(g['torch'], 'synced')[0])}")
for c in r["cpu"]:
    print(f"cpu {c['threads']:>2} thr {c['layout']:>10} {c['kind']:>13}: ours {f(c['ours'])} ms, torch fused {f(c['torch'].get('fused'))} ms")
PY
  result "$lars; compare rc $r, $(grep -c '^{' "$BUILD/gpu-compare-output.txt") rows (compare.json, RESULTS.md, results.png)"
  [ "$rc" -eq 0 ] && [ "$r" -eq 0 ]
}

phase_ab() {
  local base_tar=${AB_BASE:-$DEPS/ab-base.tar} base_src=$BUILD-base-src base=$BUILD-base backends=("$@") b log rc
  [ ${#backends[@]} -eq 0 ] && backends=(cuda)
  if [ ! -x "$base/bench/bench_step" ]; then
    need "$base_tar" "base tree (AB_BASE=COMMIT scripts/make_gpu_deps.sh writes .deps/ab-base.tar)"
    rm -rf "$base_src" && mkdir -p "$base_src" && tar -xf "$base_tar" -C "$base_src" || { result "cannot unpack $base_tar"; return 1; }
    local cfg=(-S "$base_src" -B "$base" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON -DRENAISSANCE_MPI=OFF
               -DRENAISSANCE_NCCL=OFF -DRENAISSANCE_BUILD_TESTS=OFF)
    [ -d "$DEPS" ] && cfg+=(-DRENAISSANCE_DEPS_DIR="$DEPS" -DCMAKE_PREFIX_PATH="$DEPS")
    cmake "${cfg[@]}" > "$base.configure.txt" 2>&1 || { tail -20 "$base.configure.txt"; result "the base tree does not configure"; return 1; }
    ninja -C "$base" -j"$(nproc)" bench_step 2>&1 | tail -5
    [ -x "$base/bench/bench_step" ] || { result "the base tree's bench_step did not build"; return 1; }
  fi
  local b_in=("${backends[@]}")
  backends=()
  for b in "${b_in[@]}"; do [ "$b" != build ] && backends+=("$b"); done
  if [ ${#backends[@]} -eq 0 ]; then
    result "the base's bench_step is built in $base"
    return 0
  fi
  need "$BUILD/bench/bench_step" "bench_step"
  rc=0
  for b in "${backends[@]}"; do
    log=$BUILD/gpu-ab-$b.txt
    echo "== A/B on $b: base $base_tar, new $BUILD"
    local rows=()
    if [ "${AB_ROWS:-configs}" = compare ]; then  # compare_torch.py's own rows and replays
      rows=(--rows compare --replays "$([ "$b" = cuda ] && echo 100 || echo 5)")
      [ -n "${AB_LAYOUTS:-}" ] && rows+=(--layouts "$AB_LAYOUTS")
      [ -n "${AB_KINDS:-}" ] && rows+=(--kinds "$AB_KINDS")
    else
      rows=(--layouts "${AB_LAYOUTS:-resnet50,gpt2_small}" --kinds "${AB_KINDS:-adamw,sgd_momentum,lars}"
            --configs "${AB_CONFIGS:-fp32,bf16}" --replays "$([ "$b" = cuda ] && echo 200 || echo 10)")
    fi
    "$PY" "$ROOT/bench/step_ab.py" "$base/bench/bench_step" "$BUILD/bench/bench_step" --backend "$b" \
      --rounds "${AB_ROUNDS:-3}" --threads "${AB_THREADS:-16}" "${rows[@]}" \
      --json "$OUT/ab-$b.json" 2>&1 | tee "$log" || rc=1
  done
  local worst=""
  for b in "${backends[@]}"; do
    worst+="${worst:+; }$b $(grep -h '^new/base median ratios' "$BUILD/gpu-ab-$b.txt")"
    worst+=" ($(grep -h '^new/base 95% intervals' "$BUILD/gpu-ab-$b.txt" | sed 's/^new\/base //'))"
  done
  result "${worst:-no A/B rows}"
  return "$rc"
}

phase_golden() {
  local rc
  bash "$ROOT/scripts/record_golden.sh" "$BUILD"
  rc=$?
  cp "$ROOT/audit/golden/fingerprints.json" "$ROOT/conformance/REPORT.md" "$OUT/" 2>/dev/null
  result "$([ "$rc" -eq 0 ] && echo "recorded" || echo "FAILED (rc $rc)"): fingerprints.json and REPORT.md in $OUT (review, commit)"
  return "$rc"
}

phase_cli() {
  local cli=$BUILD/cli/renaissance pass=0 fail=0 c line=() rc=0
  need "$cli" "CLI"
  local dir
  for dir in replay recorded; do
    pass=0 fail=0
    echo "== renaissance replay --backend cuda, every case of testdata/$dir"
    for c in "$ROOT"/testdata/"$dir"/*/; do
      if "$cli" replay "$c" --backend cuda; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL replay $c"; fi
    done
    line+=("$dir $pass ok, $fail failed")
    [ "$fail" -eq 0 ] || rc=1
  done
  echo "== renaissance audit"
  if "$cli" audit; then line+=("audit ok"); else line+=("audit FAILED"); rc=1; fi
  echo "== runs on cuda and cpu with skipped steps"
  if "$cli" run --backend cuda --steps 50 --json &&
     "$cli" run --backend cuda --model gpt2_small --steps 50 --nan-at 3,7 --json &&
     "$cli" run --backend cpu --threads "$(nproc)" --model gpt2_small --steps 50 --nan-at 3,7 --json; then
    line+=("runs ok")
  else
    line+=("runs FAILED"); rc=1
  fi

  # CPU == CUDA fingerprints of the model copy; the odd layout's tensors of 7, 13x1021, 5 and
  # 301x67 elements cut 8-element random-draw blocks and LARS/LAMB tiles at odd places.
  local odd=$BUILD/gpu-odd-layout.json same=0 differ=0
  cat > "$odd" <<'EOF'
{"name": "odd", "params": [
 {"name": "a.bias", "shape": [7], "role": "fc_bias"},
 {"name": "b.weight", "shape": [13, 1021], "role": "deep_conv"},
 {"name": "c.weight", "shape": [5], "role": "bn_weight"},
 {"name": "d.weight", "shape": [301, 67], "role": "fc_weight"}
]}
EOF
  fp() { "$cli" run --steps 4 --nan-at 1 --json "$@" | last_json fingerprint; }
  check_same() {  # check_same LABEL RUN-ARGS...: the CPU's and CUDA's fingerprints must be equal
    local label=$1 a b
    shift
    a=$(fp --backend cpu "$@")
    b=$(fp --backend cuda "$@")
    if [ -n "$a" ] && [ "$a" = "$b" ]; then same=$((same + 1)); echo "ok   $label: $a"
    else differ=$((differ + 1)); echo "FAIL $label: cpu $a cuda $b"; fi
  }
  echo "== CPU == CUDA fingerprints"
  local kind p g k
  for p in "bf16" "fp16" "bf16 --stochastic-rounding" "fp16 --stochastic-rounding" \
           "bf16 --grad-dtype model" "fp16 --grad-dtype model" "bf16 --stochastic-rounding --grad-dtype model" \
           "fp16 --stochastic-rounding --grad-dtype model"; do
    for kind in adamw lars lamb; do
      # shellcheck disable=SC2086  # p is --precision's value and more flags
      check_same "resnet50 $kind --precision $p" --model resnet50 --optimizer "$kind" --precision $p
    done
  done
  for kind in adamw lars lamb lion sgd_momentum; do
    for p in bf16 fp16; do
      for g in fp32 model; do
        check_same "odd $kind $p stochastic grads $g" --model "$odd" --optimizer "$kind" --precision "$p" \
          --stochastic-rounding --grad-dtype "$g"
      done
    done
  done
  for kind in adamw lars lamb; do
    for k in 2 3; do
      check_same "odd $kind bf16 stochastic --simulate-ranks $k" --model "$odd" --optimizer "$kind" --precision bf16 \
        --stochastic-rounding --simulate-ranks "$k"
    done
  done
  line+=("cpu == cuda fingerprints $same, differ $differ")
  [ "$differ" -eq 0 ] || rc=1
  result "$(join_by ';' "${line[@]}")"
  return "$rc"
}

phase_dist() {
  local cli=$BUILD/cli/renaissance parts=("$@") failures=0
  need "$BUILD/build.ninja" "CMake build"
  if ! ninja -C "$BUILD" -t targets all | grep -q '^renaissance_nccl:'; then
    result "this build has no NCCL: build with MPI=ON NCCL=ON (NCCL_ROOT for a non-system NCCL)"
    return 1
  fi
  freshen_sources; ninja -C "$BUILD" renaissance_cli sharded_mask || { result "building the CLI and sharded_mask failed"; return 1; }
  [ ${#parts[@]} -eq 0 ] && parts=(checks mask perf)
  nvidia-smi -L
  local gpus
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  # Two ranks cannot share one GPU in NCCL.
  local ks
  read -ra ks <<< "${KS:-$([ "$gpus" -ge 2 ] && echo "1 2" || echo 1)}"
  # NVLink multicast stays off (the device machines' rule); root may start mpirun in containers.
  export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  local mpirun=(mpirun --oversubscribe -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH)
  run_fp() { "$@" --json | last_json fingerprint; }
  check() {  # check WHAT A B
    if [[ "$2" == "$3" && -n "$2" ]]; then echo "ok   $1: $2"; else echo "FAIL $1: $2 != $3"; failures=$((failures + 1)); fi
  }
  local part line=() model kind K args plain ordered cpu prec tag
  for part in "${parts[@]}"; do
    case $part in
      checks)
        local models kinds precs
        read -ra models <<< "${MODELS:-resnet50 gpt2_small}"
        read -ra kinds <<< "${KINDS:-adamw lamb lars muon}"
        precs=("bf16 --stochastic-rounding" "fp16" "bf16 --grad-dtype model" "fp16 --stochastic-rounding --grad-dtype model")
        [ -n "${PRECS:-}" ] && IFS='|' read -ra precs <<< "$PRECS"
        local before=$failures
        for model in "${models[@]}"; do
          for kind in "${kinds[@]}"; do
            args=(run --model "$model" --optimizer "$kind" --steps 6 --seed 3 --loss-scale 128 --schedule cosine
                  --warmup 1 --nan-at 2 --max-grad-norm 0.05)
            plain=$(run_fp "$cli" "${args[@]}" --backend cuda)
            [[ "$model" == resnet50 ]] && check "$model $kind: CUDA == CPU" "$plain" "$(run_fp "$cli" "${args[@]}" --backend cpu)"
            for K in "${ks[@]}"; do
              tag="$model $kind K=$K"
              check "$tag replicated == plain" "$(run_fp "${mpirun[@]}" -np "$K" "$cli" "${args[@]}" --distributed nccl --grad-reduce replicated)" "$plain"
              ordered=$(run_fp "${mpirun[@]}" -np "$K" "$cli" "${args[@]}" --distributed nccl --grad-reduce ordered)
              check "$tag ordered == --simulate-ranks $K" "$ordered" "$(run_fp "$cli" "${args[@]}" --backend cuda --simulate-ranks "$K")"
              [[ "$K" == 2 ]] && check "$tag fast == ordered" "$(run_fp "${mpirun[@]}" -np 2 "$cli" "${args[@]}" --distributed nccl --grad-reduce fast)" "$ordered"
            done
          done
          # The model copy: the update sub-step writes the copy of its slice, W and the copy are
          # all-gathered (docs/distributed.md "The model copy").
          for prec in "${precs[@]}"; do
            for kind in adamw lamb; do
              # shellcheck disable=SC2206  # prec is split on purpose into --precision's value and flags
              args=(run --model "$model" --optimizer "$kind" --steps 6 --seed 3 --loss-scale 128 --schedule cosine
                    --warmup 1 --nan-at 2 --max-grad-norm 0.05 --precision $prec)
              plain=$(run_fp "$cli" "${args[@]}" --backend cuda)
              cpu=$(run_fp "$cli" "${args[@]}" --backend cpu)
              check "$model $kind $prec: CUDA == CPU" "$plain" "$cpu"
              for K in "${ks[@]}"; do
                tag="$model $kind $prec K=$K"
                check "$tag replicated == plain CPU" "$(run_fp "${mpirun[@]}" -np "$K" "$cli" "${args[@]}" --distributed nccl --grad-reduce replicated)" "$cpu"
                ordered=$(run_fp "${mpirun[@]}" -np "$K" "$cli" "${args[@]}" --distributed nccl --grad-reduce ordered)
                check "$tag ordered == --simulate-ranks $K" "$ordered" "$(run_fp "$cli" "${args[@]}" --backend cuda --simulate-ranks "$K")"
                [[ "$K" == 2 && "$prec" == *grad-dtype* ]] &&
                  check "$tag fast == ordered" "$(run_fp "${mpirun[@]}" -np 2 "$cli" "${args[@]}" --distributed nccl --grad-reduce fast)" "$ordered"
              done
            done
          done
        done
        line+=("checks: $((failures - before)) failed") ;;
      mask)
        # tests/comm/sharded_mask on CUDA ranks: replicated == the plain masked CUDA run, ordered
        # == the simulated ranks, fast == ordered, with the per-tensor counts.
        local out ok=0
        for K in "${ks[@]}"; do
          out=$("${mpirun[@]}" -np "$K" "$BUILD/tests/comm/sharded_mask" "$ROOT/tests/comm/shard_layout.json" cuda 2>&1)
          echo "$out"
          if tail -1 <<< "$out" | grep -q "all sharded mask runs match"; then ok=$((ok + 1))
          else echo "FAIL sharded_mask K=$K"; failures=$((failures + 1)); fi
        done
        line+=("mask: $ok of ${#ks[@]} K match") ;;
      perf)
        # AdamW fp32, per model: ms_per_step (median; plain: CUDA events around each step; nccl:
        # the host's wall time of ShardedStep::step() until its stream is done), its minimum,
        # comm_ms_per_step (CUDA events around the communication phases), rank 0's arena bytes.
        perf() {  # perf LABEL CMD...
          local json
          if ! json=$("${@:2}" --json); then
            echo "FAIL perf $model $1: the run failed"; failures=$((failures + 1)); return 0
          fi
          "$PY" -c 'import json,sys
j = json.loads([l for l in sys.stdin.read().splitlines() if l.startswith("{")][-1])
comm = "%.3f" % j["comm_ms_per_step"] if "comm_ms_per_step" in j else "-"
print("perf %-10s %-18s %9.3f %9.3f %9s %14d" % (sys.argv[1], sys.argv[2], j["ms_per_step"], j["ms_per_step_min"], comm,
                                               j["arena_bytes_per_rank"]))' "$model" "$1" <<< "$json"
        }
        printf "perf %-10s %-18s %9s %9s %9s %14s\n" model run ms/step min_ms comm_ms arena_bytes
        local perf_models pargs mode
        read -ra perf_models <<< "${PERF_MODELS:-resnet50 gpt2_small}"
        for model in "${perf_models[@]}"; do
          pargs=(run --model "$model" --optimizer adamw --steps "${PERF_STEPS:-50}" --seed 3)
          perf "K=1 plain" "$cli" "${pargs[@]}" --backend cuda
          perf "K=1 nccl ordered" "${mpirun[@]}" -np 1 "$cli" "${pargs[@]}" --distributed nccl --grad-reduce ordered
          [[ " ${ks[*]} " == *" 2 "* ]] || continue
          for mode in replicated ordered fast; do
            perf "K=2 nccl $mode" "${mpirun[@]}" -np 2 "$cli" "${pargs[@]}" --distributed nccl --grad-reduce "$mode"
          done
        done
        line+=("perf table in the log") ;;
      *) result "unknown dist part $part"; return 2 ;;
    esac
  done
  result "K = ${ks[*]}; $(join_by ';' "${line[@]}"); $failures failed in all"
  [ "$failures" -eq 0 ]
}

# ---- one phase, in its own process (the parent bounds it with timeout) ----
if [ "${1:-}" = --phase ]; then
  name=$2
  shift 2
  echo "== gpu.sh phase $name $* ($(date -u '+%F %T') UTC; BUILD=$BUILD)"
  "phase_$name" "$@"
  exit $?
fi

# ---- the parent: check every phase first, then run them in order ----
case ${1:-} in
  -h | --help) usage; exit 0 ;;
  --digest) source_digest; exit 0 ;;
esac
if [ $# -eq 0 ]; then usage >&2; exit 2; fi
for spec in "$@"; do
  name=${spec%%:*}
  if [ -z "$name" ] || [ -z "${DEFAULT_LIMIT[$name]+x}" ]; then
    echo "gpu.sh: unknown phase '$name' (phases: ${PHASES[*]})" >&2
    usage >&2
    exit 2
  fi
done

mkdir -p "$OUT"
{
  date -u
  # A digest of the sources as they are here (the device's copy of the tree may carry older git
  # metadata, so `git log` there can name another commit); `scripts/gpu.sh --digest` on the dev
  # machine prints the same value for the same files.
  echo "sources $(source_digest)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  # The host CPU, its logical CPUs and how many share a core (a core's AMX tile unit serves both
  # of its hyperthreads), and the matrix/dot-product extensions its CPU rows can use (AMX, AVX-512
  # VNNI/BF16).
  echo "host cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) logical CPUs," \
    "$(lscpu 2>/dev/null | sed -n 's/^Thread(s) per core: *//p' | head -1) per core;" \
    "$(grep -m1 '^flags' /proc/cpuinfo | grep -oE '(amx_[a-z0-9]+|avx512_vnni|avx512_bf16|avx_vnni)' | sort -u | tr '\n' ' ')"
  nvcc --version 2>&1 | tail -2
  cmake --version | head -1
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1
} > "$OUT/env.log" 2>&1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)

declare -a TABLE
build_failed=0
status=0
for spec in "$@"; do
  name=${spec%%:*}
  args=()
  [[ "$spec" == *:* ]] && IFS=',' read -ra args <<< "${spec#*:}"
  # Only letters, digits, '-', '_' and '.' in the name: the device tool brings back no file whose
  # name holds another character (python:@1/2 logs as python-part1-2.log).
  log=$(echo "$spec" | sed 's/@/part/g' | tr ':,/' '---' | tr -c 'A-Za-z0-9._\n-' '_')
  # A long ARG list (many test files) would make a file name past the file system's 255 bytes.
  [ ${#log} -gt 80 ] && log="$name-$(echo "$spec" | md5sum | cut -c1-8)"
  limit_var=TIMEOUT_${name^^}
  limit=${!limit_var:-${DEFAULT_LIMIT[$name]}}
  needs_build=1
  [ "$name" = build ] && needs_build=0
  [[ "$name" == python || "$name" == torchsuite ]] && [ "${PYTHON_EXT:-pip}" != build ] && needs_build=0
  [ "$name" = wheel ] && needs_build=0
  if [ $needs_build -eq 1 ] && [ $build_failed -eq 1 ]; then
    TABLE+=("$(printf '%-24s %-8s %5s  %s' "$spec" SKIPPED - "the build failed")")
    continue
  fi
  echo "== $spec (limit $limit s, log $OUT/$log.log)"
  RESULT_FILE=$OUT/.result-$log
  rm -f "$RESULT_FILE"
  t0=$SECONDS
  # timeout signals the phase's whole process group: ninja, pytest and mpirun stop with it.
  RESULT_FILE=$RESULT_FILE PHASE_LIMIT=$limit timeout -k 15 "$limit" bash "$SELF" --phase "$name" "${args[@]}" \
    > "$OUT/$log.log" 2>&1
  rc=$?
  secs=$((SECONDS - t0))
  res=$(cat "$RESULT_FILE" 2>/dev/null)
  rm -f "$RESULT_FILE"
  case $rc in
    0) st=ok ;;
    124 | 137) st=FAILED; res="timed out after $limit s ($limit_var)${res:+; $res}" ;;
    *) st=FAILED; res="rc $rc${res:+: $res}" ;;
  esac
  if [ "$st" != ok ]; then
    status=1
    [ "$name" = build ] && build_failed=1
    echo "-- $spec FAILED; the end of $log.log:"
    tail -n 15 "$OUT/$log.log" | cut -c1-240
  fi
  res=${res:-"(no result line; see $log.log)"}
  TABLE+=("$(printf '%-24s %-8s %5s  %s' "$spec" "$st" "$secs" "${res:0:200}")")
done

echo
echo "== gpu.sh on ${GPU:-no GPU}, BUILD=$BUILD, logs in $OUT"
printf '%-24s %-8s %5s  %s\n' phase status s result
printf '%s\n' "${TABLE[@]}"
exit $status
