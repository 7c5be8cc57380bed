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
