"""The counting and classification of tests/torch_suite/run_torch_optim_suite.py (the harness
that runs PyTorch's TestOptimRenewed against renaissance.torch on a torch with optim_db), on fixed
junit reports written as pytest writes them. Needs no torch: the harness reads junit files alone."""
import importlib.util
import json
import os

import pytest

_HARNESS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch_suite",
                        "run_torch_optim_suite.py")
_spec = importlib.util.spec_from_file_location("run_torch_optim_suite", _HARNESS)
suite = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(suite)


def _case(cls, name, body=""):
    return '<testcase classname="test_optim.%s" name="%s" time="0.01">%s</testcase>' % (cls, name, body)


def _junit(*cases):
    return ('<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="0" '
            'skipped="0" tests="%d">%s</testsuite></testsuites>' % (len(cases), "".join(cases)))


def _fail(message, text="", tag="failure"):
    return '<%s message="%s">%s</%s>' % (tag, message, text, tag)


# Ours: a mix of every status and cause, on cpu and cuda.
OURS = _junit(
    _case("TestOptimRenewedCPU", "test_errors_SGD_cpu_float32"),
    _case("TestOptimRenewedCPU", "test_step_is_noop_for_zero_grads_SGD_cpu_float32",
          _fail("RuntimeError: `fused` does not support `differentiable` (SGD: the library&apos;s step is always "
                "fused; differentiable=True is not supported)")),
    _case("TestOptimRenewedCPU", "test_foreach_matches_forloop_Adam_cpu_float64",
          _fail("ValueError: parameter of shape (3, 2) is torch.float64: renaissance.torch takes float32, bfloat16, "
                "float16 and complex64 parameters")),
    # A float64 test failing on its numbers is no refusal: the exception decides, not the name.
    _case("TestOptimRenewedCPU", "test_foreach_matches_forloop_AdamW_cpu_float64",
          _fail("AssertionError: Tensor-likes are not close!")),
    _case("TestOptimRenewedCPU", "test_rosenbrock_sparse_with_lrsched_True_SGD_cpu_float64",
          _fail("RuntimeError: sparse tensors do not have strides")),
    # No message attribute: the exception is read from the traceback's E lines, not from the
    # source lines above them (which mention differentiable).
    _case("TestOptimRenewedCPU", "test_state_dict_deterministic_is_named_optim0_True_is_named_optim1_True_Adam_cpu_float32",
          _fail("", "    all_optim_inputs = f(skip=(&quot;differentiable&quot;,))\n"
                    "E   TypeError: optimizer params must be tensors, got tuple\n")),
    _case("TestOptimRenewedCPU", "test_can_load_from_to_named_state_dict_is_named_optim0_True_is_named_optim1_False_AdamW_cpu_float32",
          _fail("TypeError: optimizer params must be tensors, got tuple")),
    _case("TestOptimRenewedCPU", "test_adamw_serialization_cpu"),
    _case("TestOptimRenewedCUDA", "test_fused_matches_forloop_AdamW_cuda_float16",
          _fail("ValueError: AdamW: maximize=True is not supported")),
    _case("TestOptimRenewedCUDA", "test_cpu_load_state_dict_impl_capturable_SGD_cuda_float32",
          '<skipped type="pytest.skip" message="SGD does not currently support capturable">skip</skipped>'),
    _case("TestOptimRenewedCUDA", "test_peak_memory_foreach_Adam_cuda_float32",
          _fail("RuntimeError: CUDA error: an illegal memory access was encountered", tag="error")),
    _case("TestOptimRenewedCUDA", "test_tensor_lr_num_dim_0_Adam_cuda_float32"),
    # What pytest writes last when the run is interrupted (a time limit): no test.
    '<testcase time="0.000" />',
)

# torch's classes on the same file: everything passes but one test that ours fails too.
REF = _junit(
    _case("TestOptimRenewedCPU", "test_errors_SGD_cpu_float32"),
    _case("TestOptimRenewedCPU", "test_step_is_noop_for_zero_grads_SGD_cpu_float32"),
    _case("TestOptimRenewedCPU", "test_foreach_matches_forloop_Adam_cpu_float64"),
    _case("TestOptimRenewedCPU", "test_foreach_matches_forloop_AdamW_cpu_float64"),
    _case("TestOptimRenewedCPU", "test_rosenbrock_sparse_with_lrsched_True_SGD_cpu_float64"),
    _case("TestOptimRenewedCPU", "test_state_dict_deterministic_is_named_optim0_True_is_named_optim1_True_Adam_cpu_float32"),
    _case("TestOptimRenewedCPU", "test_can_load_from_to_named_state_dict_is_named_optim0_True_is_named_optim1_False_AdamW_cpu_float32"),
    _case("TestOptimRenewedCPU", "test_adamw_serialization_cpu"),
    _case("TestOptimRenewedCUDA", "test_fused_matches_forloop_AdamW_cuda_float16"),
    _case("TestOptimRenewedCUDA", "test_cpu_load_state_dict_impl_capturable_SGD_cuda_float32",
          '<skipped type="pytest.skip" message="SGD does not currently support capturable">skip</skipped>'),
    _case("TestOptimRenewedCUDA", "test_peak_memory_foreach_Adam_cuda_float32",
          _fail("AssertionError: 1024 not less than or equal to 512")),
    _case("TestOptimRenewedCUDA", "test_tensor_lr_num_dim_0_Adam_cuda_float32"),
    # A test absent from our run (e.g. cut by a time limit) that torch's classes pass.
    _case("TestOptimRenewedCUDA", "test_tensor_lr_num_dim_1_Adam_cuda_float32"),
)


@pytest.fixture
def files(tmp_path):
    ours, ref = tmp_path / "ours.xml", tmp_path / "ref.xml"
    ours.write_text(OURS)
    ref.write_text(REF)
    return str(ours), str(ref)


def _by_name(records):
    return {r["name"]: r for r in records}


def test_names_give_class_and_device():
    assert suite.parse_test_name("test_optim.TestOptimRenewedCUDA", "test_foreach_matches_forloop_AdamW_cuda_float64") \
        == ("AdamW", "cuda")
    assert suite.parse_test_name("test_optim.TestOptimRenewedCPU", "test_tensor_lr_num_dim_2_Adam_cpu_float32") \
        == ("Adam", "cpu")
    # torch's own AdamW test, not parametrized by optim_db: no class; lowercase adamw is no class.
    assert suite.parse_test_name("test_optim.TestOptimRenewedCPU", "test_adamw_serialization_cpu") == ("-", "cpu")
    # Other classes of optim_db whose names contain Adam are not Adam.
    assert suite.parse_test_name("TestOptimRenewedCPU", "test_errors_SparseAdam_cpu_float32") == ("-", "cpu")
    assert suite.parse_test_name("TestOptimRenewedCPU", "test_errors_NAdam_cpu_float32")[0] == "-"


def test_statuses_reasons_and_causes(files):
    recs = _by_name(suite.read_junit(files[0]))
    assert len(recs) == 12
    assert recs["test_errors_SGD_cpu_float32"]["status"] == "passed"
    assert recs["test_cpu_load_state_dict_impl_capturable_SGD_cuda_float32"]["status"] == "skipped"
    assert recs["test_peak_memory_foreach_Adam_cuda_float32"]["status"] == "error"
    reason = {n: r.get("reason") for n, r in recs.items() if r["status"] in ("failed", "error")}
    assert reason == {
        "test_step_is_noop_for_zero_grads_SGD_cpu_float32": "differentiable",
        "test_foreach_matches_forloop_Adam_cpu_float64": "float64",
        "test_foreach_matches_forloop_AdamW_cpu_float64": None,
        "test_rosenbrock_sparse_with_lrsched_True_SGD_cpu_float64": "sparse",
        "test_state_dict_deterministic_is_named_optim0_True_is_named_optim1_True_Adam_cpu_float32": None,
        "test_can_load_from_to_named_state_dict_is_named_optim0_True_is_named_optim1_False_AdamW_cpu_float32": None,
        "test_fused_matches_forloop_AdamW_cuda_float16": None,
        "test_peak_memory_foreach_Adam_cuda_float32": None,
    }
    named = recs["test_state_dict_deterministic_is_named_optim0_True_is_named_optim1_True_Adam_cpu_float32"]
    assert named["exception"] == "TypeError: optimizer params must be tensors, got tuple"
    assert named["cause"] == "TypeError: optimizer params must be tensors, got tuple"


def test_causes_mask_numbers_and_shapes():
    a = suite.cause_of("ValueError: a parameter (shape (10, 5)) is listed twice\nmore text")
    b = suite.cause_of("ValueError: a parameter (shape (2,)) is listed twice")
    assert a == b == "ValueError: a parameter (shape (shape)) is listed twice"
    assert suite.cause_of("AssertionError: 1024 not less than or equal to 512.5") == \
        "AssertionError: N not less than or equal to N"
    assert suite.cause_of("") == "(no message)"
    # Digits inside names stay: float32 and float64 are different causes.
    assert suite.cause_of("ValueError: parameter of shape (3, 2) is torch.float64: takes float32") == \
        "ValueError: parameter of shape (shape) is torch.float64: takes float32"


def test_design_reasons_come_from_the_exception_not_the_name():
    # test_rosenbrock_sparse on float32 parameters, refused first for SGD's dampening: one of the rest.
    assert suite.design_reason("test_rosenbrock_sparse_with_lrsched_False_SGD_cpu_float64",
                               "ValueError: SGD: dampening=0.5 is not supported (only 0)") is None
    assert suite.design_reason("test_tensor_lr_num_dim_0_SGD_cpu_float32",
                               "ValueError: parameter of shape (2,) is torch.float64: ...") == "float64"
    assert suite.design_reason("x", "RuntimeError: Could not run 'aten::add' with arguments from the "
                                    "'SparseCPU' backend") == "sparse"
    assert suite.design_reason("x", "TypeError: optimizer params must be tensors, got tuple") is None
    # Only differentiable, float64 and sparse are refused by design: a test that patches a
    # per-implementation function (test_defaults_changed_to_foreach) and fails is one of the rest.
    assert suite.design_reason("test_defaults_changed_to_foreach_SGD_cuda_float32",
                               "AttributeError: <module 'renaissance.torch' from '/x/torch.py'> does not have the "
                               "attribute '_multi_tensor_sgd'") is None
    assert suite.design_reason("x", "AttributeError: 'SGD' object has no attribute '_multi_tensor_sgd'") is None


def test_counts_per_class_and_device(files):
    table = suite.count(suite.read_junit(files[0]))
    got = {k: {s: c[s] for s in ("passed", "failed", "skipped", "errors", "by_design", "other")}
           for k, c in table.items()}
    assert got == {
        ("-", "cpu"): dict(passed=1, failed=0, skipped=0, errors=0, by_design=0, other=0),
        ("Adam", "cpu"): dict(passed=0, failed=2, skipped=0, errors=0, by_design=1, other=1),
        ("AdamW", "cpu"): dict(passed=0, failed=2, skipped=0, errors=0, by_design=0, other=2),
        ("SGD", "cpu"): dict(passed=1, failed=2, skipped=0, errors=0, by_design=2, other=0),
        ("Adam", "cuda"): dict(passed=1, failed=0, skipped=0, errors=1, by_design=0, other=1),
        ("AdamW", "cuda"): dict(passed=0, failed=1, skipped=0, errors=0, by_design=0, other=1),
        ("SGD", "cuda"): dict(passed=0, failed=0, skipped=1, errors=0, by_design=0, other=0),
    }
    top = suite.top_causes(suite.read_junit(files[0]))
    assert top[0] == ("TypeError: optimizer params must be tensors, got tuple", 2)
    assert sum(n for _, n in top) == 5


def test_comparison_with_the_reference(files):
    ours, ref = suite.read_junit(files[0]), suite.read_junit(files[1])
    cmp = suite.compare(ours, ref)
    assert cmp["ref_passed"] == 11
    # Of the reference's passes: ours passes 3 (errors, serialization, tensor_lr), fails 3 by design
    # and 4 others; the error is on a test the reference fails too, so it is no regression.
    assert cmp["ours_passed"] == 3
    assert cmp["by_design"] == 3
    assert cmp["other"] == 4
    assert cmp["other_ids"] == sorted([
        "TestOptimRenewedCPU::test_foreach_matches_forloop_AdamW_cpu_float64",
        "TestOptimRenewedCPU::test_can_load_from_to_named_state_dict_is_named_optim0_True_is_named_optim1_False_AdamW_cpu_float32",
        "TestOptimRenewedCPU::test_state_dict_deterministic_is_named_optim0_True_is_named_optim1_True_Adam_cpu_float32",
        "TestOptimRenewedCUDA::test_fused_matches_forloop_AdamW_cuda_float16",
    ])
    assert cmp["missing"] == ["TestOptimRenewedCUDA::test_tensor_lr_num_dim_1_Adam_cuda_float32"]
    assert cmp["other_share"] == pytest.approx(4 / 8)


def test_report_command_prints_and_writes_json(files, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert suite.main(["report", files[0], "--against", files[1], "--json", str(out), "--label", "ours"]) == 0
    text = capsys.readouterr().out
    assert "== ours: 12 tests" in text
    assert "refused by design: differentiable 1, float64 1, sparse 1" in text
    assert ("against the reference: torch's classes pass 11; ours pass 3 of those, fail 3 refused by design and "
            "4 other (50.0 % of the 8 not refused by design)") in text
    lines = [ln.split() for ln in text.splitlines()]
    assert ["all", "3", "7", "1", "1", "3", "5"] in lines
    s = json.loads(out.read_text())
    assert s["counts"]["SGD/cpu"] == {"passed": 1, "failed": 2, "by_design": 2}
    assert s["against_reference"]["other"] == 4
    assert len(s["failures"]) == 8


def test_table_of_both_runs_per_device(files, tmp_path, capsys):
    out = tmp_path / "all.json"
    missing = str(tmp_path / "none.xml")
    assert suite.main(["table", "--json", str(out), "cpu:%s:%s" % (files[1], files[0]),
                       "cuda:%s:%s" % (files[1], missing)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [ln.split() for ln in lines]
    # torch's run: 11 passed, 1 failed, 1 skipped; ours as counted above, then the comparison.
    assert ["cpu", "torch", "11", "1", "1", "0", "0", "1"] in rows
    assert ["cpu", "ours", "3", "7", "1", "1", "3", "5", "3", "by", "design,", "4", "other", "(50.0", "%)"] in rows
    assert "cuda  ours   (no report)" in lines
    assert lines[-1] == ("torchsuite: cpu: torch 11 passed, ours 3 of those; 3 by design, 4 other (50.0 %); "
                         "cuda: no report of ours")
    combined = json.loads(out.read_text())
    assert combined["cuda"]["ours"] is None
    assert combined["cpu"]["ours"]["against_reference"]["by_design"] == 3


# The float32 state of a bf16/fp16 parameter: a class the exception text alone does not name.
def test_a_recorded_reason_makes_a_failure_by_design(tmp_path):
    prop = '<properties><property name="%s" value="fp32 state" /></properties>' % suite.REASON_PROPERTY
    path = tmp_path / "r.xml"
    path.write_text(_junit(
        _case("TestOptimRenewedCUDA", "test_fused_cpu_matches_cuda_Adam_cuda_bfloat16",
              prop + _fail("AssertionError: Tensor-likes are not close!")),
        _case("TestOptimRenewedCUDA", "test_fused_cpu_matches_cuda_AdamW_cuda_bfloat16",
              _fail("AssertionError: Tensor-likes are not close!"))))
    got = _by_name(suite.read_junit(str(path)))
    assert got["test_fused_cpu_matches_cuda_Adam_cuda_bfloat16"]["reason"] == "fp32 state"
    assert got["test_fused_cpu_matches_cuda_AdamW_cuda_bfloat16"]["reason"] is None


def test_arena_out_of_memory_is_by_design_only_for_16_bit_state():
    oom = "RuntimeError: cuda backend: cannot allocate an arena of 68826433280 bytes on cuda (NVIDIA H200): out of memory"
    ours = (oom + "; renaissance.torch: 4294967296 elements of float16 parameters take 16 bytes each in the arena "
            "(float32 master weights 4, exp_avg 4, exp_avg_sq 4, the float16 copy 2, the float16 gradient 2); the "
            "state is float32 for float16 parameters (torch.optim keeps it in the parameter's dtype: 8 bytes each)")
    assert suite.design_reason("test_foreach_large_tensor_Adam_cuda_float16", ours) == "fp32 state"
    assert suite.design_reason("test_foreach_large_tensor_Adam_cuda_float16", oom) is None
    fp32 = oom + "; renaissance.torch: 10 elements of float32 parameters take 16 bytes each in the arena"
    assert suite.design_reason("test_x_Adam_cuda_float32", fp32) is None


# TensorTracker's pop_check_set (the next reference, compared with assertEqual's defaults for the
# dtype: float32's for float32 tensors) and test_optim.py's comparison of the state tensors, with
# its source line; run here and written into the end-to-end run's test file.
_COMPARE_SRC = """
import torch


class _Tracker:
    def __init__(self, refs):
        self.refs = list(refs)

    def pop_check_set(self, tensor_to_set, testcase):
        ref = self.refs.pop(0)
        torch.testing.assert_close(tensor_to_set, ref)


def _compare_between(new_p, new_p_state, refs):
    tracker, self = _Tracker(refs), None
    for k in new_p_state:
        tracker.pop_check_set(new_p_state[k], self)
"""
_compare_ns = {}


def _compare_between(*args):
    if not _compare_ns:
        import linecache
        # The harness reads the failing line's source, as from a file.
        linecache.cache["<compare>"] = (len(_COMPARE_SRC), None, _COMPARE_SRC.splitlines(True), "<compare>")
        exec(compile(_COMPARE_SRC, "<compare>", "exec"), _compare_ns)
    return _compare_ns["_compare_between"](*args)


def test_state_dtype_reason_reads_the_failing_comparison():
    torch = pytest.importorskip("torch")
    ulp = 2.0 ** -13  # one bf16 ulp of a gradient in [2^-6, 2^-5)
    ref = torch.tensor([0.0129, 0.02, -0.013])
    near = ref + torch.tensor([0.1 * ulp, 0.0, 0.0])  # exp_avg off by (1 - beta1) * one gradient ulp
    far = ref + torch.tensor([0.002, 0.0, 0.0])  # beyond bf16's tolerance too
    reasons = []
    for p_dtype, state, r in ((torch.bfloat16, near, ref), (torch.float16, near, ref), (torch.bfloat16, far, ref),
                              (torch.float32, near, ref),
                              (torch.bfloat16, far.to(torch.bfloat16), ref.to(torch.bfloat16))):
        p = torch.zeros(3, dtype=p_dtype)
        with pytest.raises(AssertionError) as ei:
            _compare_between(p, {"exp_avg": state}, [r])
        reasons.append(suite._state_dtype_reason(ei))
    # fp16's tolerance is 1e-3 relative: 1.2e-5 on 0.0129 is 9.5e-4, within it.
    assert reasons == ["fp32 state", "fp32 state", None, None, None]


def test_the_plugin_records_the_reason_in_the_junit_report(tmp_path):
    """End to end: a pytest run with the harness's plugin writes the reason of a failing float32
    state comparison of a bf16 parameter into the junit report, and read_junit counts it by design;
    the same comparison for a float32 parameter stays a failure of the rest."""
    pytest.importorskip("torch")
    import subprocess
    import sys
    test = tmp_path / "test_fake_optim.py"
    test.write_text(_COMPARE_SRC +
                    "def _run(dtype):\n"
                    "    ref = torch.tensor([0.0129, 0.02])\n"
                    "    _compare_between(torch.zeros(2, dtype=dtype), {'exp_avg': ref + 1.2e-5}, [ref])\n"
                    "def test_fused_cpu_matches_cuda_Adam_cuda_bfloat16():\n"
                    "    _run(torch.bfloat16)\n"
                    "def test_fused_cpu_matches_cuda_Adam_cuda_float32():\n"
                    "    _run(torch.float32)\n")
    junit = tmp_path / "r.xml"
    code = ("import importlib.util, sys, pytest\n"
            "spec = importlib.util.spec_from_file_location('h', %r)\n"
            "h = importlib.util.module_from_spec(spec); spec.loader.exec_module(h)\n"
            "sys.exit(pytest.main([%r, '-q', '-p', 'no:cacheprovider', '--junitxml', %r, '-o', 'junit_family=xunit1',"
            " '--rootdir', %r], plugins=[h._cause_plugin()]))\n" % (_HARNESS, str(test), str(junit), str(tmp_path)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(tmp_path))
    assert out.returncode == 1, out.stdout + out.stderr  # both tests fail
    got = _by_name(suite.read_junit(str(junit)))
    assert got["test_fused_cpu_matches_cuda_Adam_cuda_bfloat16"]["reason"] == "fp32 state"
    assert got["test_fused_cpu_matches_cuda_Adam_cuda_float32"]["reason"] is None


def test_a_documented_deviation_counts_among_the_other_failures(tmp_path):
    # fp32 state is named in the report but is not refused by design: the suite's 5 % budget of
    # the rest holds it.
    prop = '<properties><property name="%s" value="fp32 state" /></properties>' % suite.REASON_PROPERTY
    path = tmp_path / "r.xml"
    path.write_text(_junit(_case("TestOptimRenewedCUDA", "test_fused_cpu_matches_cuda_Adam_cuda_bfloat16",
                                 prop + _fail("AssertionError: Tensor-likes are not close!"))))
    records = suite.read_junit(str(path))
    c = suite.count(records)[("Adam", "cuda")]
    assert (c["by_design"], c["other"]) == (0, 1)
    report = suite.format_report(records, "ours")
    assert "documented deviations (among the other failures): fp32 state 1" in report
