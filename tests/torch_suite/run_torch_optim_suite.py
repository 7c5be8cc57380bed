#!/usr/bin/env python3
"""PyTorch's own optimizer tests against renaissance.torch: TestOptimRenewed of torch's
test/test_optim.py (not part of this repository; scripts/gpu.sh's torchsuite phase and
docs/python.md say where it comes from), with the optim_cls of the SGD, Adam and AdamW entries
of torch.testing._internal.common_optimizers.optim_db swapped for renaissance.torch's classes.

    run_torch_optim_suite.py run [--reference] [--device cpu|cuda] [--test-file F] --junit X --json J
    run_torch_optim_suite.py report OURS.xml [--against REF.xml] [--json J]
    run_torch_optim_suite.py table [--json J] DEVICE:REF.xml:OURS.xml...

`run` needs a torch with optim_db (2.x; torch 1.13 has none) and expecttest. It restricts optim_db
to the three entries (the tests are device-generic and instantiated for cpu and cuda as torch
does; --device keeps one of the instantiated classes), swaps their classes unless --reference
(torch's own classes, the same file and the same entries), checks the swap took in the collected
test module, runs pytest in this process with a junit report, and prints the counts. `report`
reads junit files only (no torch): the counts of one run and, with --against, the tests that the
reference run passes and this one does not; `table` the short table of both runs per device (a
missing file, e.g. a run cut by a time limit, is a row that says so).

Counts are per optimizer class and device: passed, failed, skipped, errors, and the failures and
errors split into "refused by design" (the exception names differentiable=True, float64
parameters or sparse gradients, which renaissance.torch refuses, or a test patches one of torch's
per-implementation step functions, which renaissance.torch does not have; or the float32 state of
a bf16/fp16 parameter: an arena too large for the device, or a state comparison that fails at
float32's tolerance and passes at the parameter dtype's, as torch's own state is compared:
docs/python.md) and the rest, with the most frequent causes of the rest.
"""
import argparse
import collections
import json
import os
import re
import signal
import sys
import types
import xml.etree.ElementTree as ET

KINDS = ("SGD", "Adam", "AdamW")
# The failures refused by design: the features this package refuses (the suite's target leaves
# them out of the count of the rest).
DESIGN_REASONS = ("differentiable", "float64", "sparse")
# Documented deviations: named in the report, but counted among the other failures.
KNOWN_DEVIATIONS = ("fp32 state",)
# The junit property a run records for a failure whose cause the exception text does not name
# (_CausePlugin): its value is one of KNOWN_DEVIATIONS.
REASON_PROPERTY = "renaissance_reason"
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_TEST_FILE = os.path.join(_ROOT, ".deps", "torch_suite", "test_optim.py")

# ---- reading junit reports (no torch needed) ----

# The exception text of a failure names the refused feature: renaissance.torch's refusals say
# "differentiable=True is not supported", "is torch.float64: renaissance.torch takes ...", and a
# sparse gradient fails in torch's or our code with a message that says sparse.
_TEXT_REASONS = (
    ("differentiable", re.compile(r"differentiable", re.I)),
    ("float64", re.compile(r"float64|torch\.double\b|\bDouble\b")),
    ("sparse", re.compile(r"sparse", re.I)),
    # The arena of a bf16/fp16 parameter could not be allocated and renaissance.torch's text says
    # why it is larger than torch's: float32 master weights and state (16 bytes per element for
    # Adam against torch's 8; docs/python.md).
    ("fp32 state", re.compile(r"cannot allocate an arena.*the state is float32 for (bfloat16|float16) parameters",
                              re.S)),
)


def parse_test_name(classname, name):
    """(optimizer class or '-', device) of a test of the instantiated TestOptimRenewed<DEVICE>."""
    cls = classname.rsplit(".", 1)[-1]
    m = re.match(r"TestOptimRenewed(CPU|CUDA|[A-Z]+)$", cls)
    device = m.group(1).lower() if m else "?"
    tokens = name.split("_")
    kind = next((t for t in tokens if t in KINDS), "-")
    return kind, device


def exception_text(message, text):
    """The failure's exception: junit's message attribute, else the traceback's 'E ' lines."""
    if message and message.strip():
        return message.strip()
    lines = [ln[1:].strip() for ln in (text or "").splitlines() if ln.startswith("E ")]
    return "\n".join(lines).strip()


def design_reason(name, exc, recorded=None):
    """A DESIGN_REASONS entry when the failure is one renaissance.torch makes by design, a
    KNOWN_DEVIATIONS entry when it is a documented deviation (counted among the rest), else None.
    The exception's text decides, or what the run recorded about the failing comparison
    (recorded: the REASON_PROPERTY, see _state_dtype_reason), not the test's name: a test named
    float64 or sparse may fail first on another refusal (test_rosenbrock_sparse's params are
    float32 and its first configuration has SGD's dampening), which is then one of the rest."""
    if recorded in DESIGN_REASONS + KNOWN_DEVIATIONS:
        return recorded
    for reason, pattern in _TEXT_REASONS:
        if pattern.search(exc or ""):
            return reason
    return None


def cause_of(exc):
    """A short key grouping failures by cause: the first line of the exception, with numbers,
    shapes and quoted values masked."""
    line = (exc or "(no message)").strip().splitlines()[0] if (exc or "").strip() else "(no message)"
    line = re.sub(r"0x[0-9a-f]+", "0x_", line)
    line = re.sub(r"\(\d+(, \d+)*,?\)", "(shape)", line)
    line = re.sub(r"(?<![A-Za-z_\d])-?\d+(\.\d+)?(e[-+]?\d+)?", "N", line)  # not float32's 32
    return line[:160]


def read_junit(path):
    """The test records of a pytest junit file: one dict per testcase with id, name, kind,
    device, status (passed, failed, error, skipped), exception and, for failures and errors,
    reason (a DESIGN_REASONS entry or None) and cause."""
    root = ET.parse(path).getroot()
    records = []
    for tc in root.iter("testcase"):
        classname, name = tc.get("classname", ""), tc.get("name", "")
        if not name:  # the nameless entry pytest adds when a run is interrupted
            continue
        kind, device = parse_test_name(classname, name)
        status, exc, recorded = "passed", "", None
        for prop in tc.iter("property"):
            if prop.get("name") == REASON_PROPERTY:
                recorded = prop.get("value")
        for child in tc:
            if child.tag in ("failure", "error"):
                # A failure beside an error (teardown) counts as the failure.
                if status != "failed":
                    status = "failed" if child.tag == "failure" else "error"
                    exc = exception_text(child.get("message"), child.text)
            elif child.tag == "skipped" and status == "passed":
                status = "skipped"
                exc = (child.get("message") or "").strip()
        rec = {"id": "%s::%s" % (classname.rsplit(".", 1)[-1], name), "name": name, "kind": kind,
               "device": device, "status": status, "exception": exc}
        if status in ("failed", "error"):
            rec["reason"] = design_reason(name, exc, recorded)
            rec["cause"] = cause_of(exc)
        records.append(rec)
    return records


def count(records):
    """{(kind, device): Counter of passed, failed, skipped, errors, by_design, other}."""
    table = collections.OrderedDict()
    for r in sorted(records, key=lambda r: (r["device"], r["kind"])):
        c = table.setdefault((r["kind"], r["device"]), collections.Counter())
        c[{"error": "errors"}.get(r["status"], r["status"])] += 1
        if r["status"] in ("failed", "error"):
            c["by_design" if r["reason"] in DESIGN_REASONS else "other"] += 1
    return table


def top_causes(records, n=12):
    """The most frequent causes of the failures and errors not refused by design."""
    rest = [r["cause"] for r in records if r["status"] in ("failed", "error") and not r["reason"]]
    return collections.Counter(rest).most_common(n)


def compare(ours, ref):
    """The tests the reference passes that ours does not (failed or error), split by design /
    other, and the share of the rest among the reference's passes not refused by design."""
    ref_status = {r["id"]: r["status"] for r in ref}
    regressions = [r for r in ours if ref_status.get(r["id"]) == "passed" and r["status"] in ("failed", "error")]
    by_design = [r for r in regressions if r["reason"] in DESIGN_REASONS]
    other = [r for r in regressions if r["reason"] not in DESIGN_REASONS]
    ref_passed = sum(1 for s in ref_status.values() if s == "passed")
    ours_passed_of_those = sum(1 for r in ours if ref_status.get(r["id"]) == "passed" and r["status"] == "passed")
    base = ref_passed - len(by_design)
    return {"ref_passed": ref_passed, "ours_passed": ours_passed_of_those, "by_design": len(by_design),
            "other": len(other), "other_share": (len(other) / base) if base else 0.0,
            "other_ids": sorted(r["id"] for r in other),
            "missing": sorted(i for i, s in ref_status.items() if s == "passed" and i not in {r["id"] for r in ours})}


def format_report(records, label, ref=None):
    out = ["== %s: %d tests" % (label, len(records)),
           "%-6s %-5s %7s %7s %7s %7s %10s %7s" % ("class", "dev", "passed", "failed", "skipped", "errors",
                                                    "by_design", "other")]
    total = collections.Counter()
    for (kind, device), c in count(records).items():
        total.update(c)
        out.append("%-6s %-5s %7d %7d %7d %7d %10d %7d" % (kind, device, c["passed"], c["failed"], c["skipped"],
                                                          c["errors"], c["by_design"], c["other"]))
    out.append("%-6s %-5s %7d %7d %7d %7d %10d %7d" % ("all", "", total["passed"], total["failed"], total["skipped"],
                                                      total["errors"], total["by_design"], total["other"]))
    reasons = collections.Counter(r["reason"] for r in records if r["status"] in ("failed", "error") and r["reason"])
    if reasons:
        out.append("refused by design: " + ", ".join("%s %d" % (k, reasons[k]) for k in DESIGN_REASONS if reasons[k]))
        if any(reasons[k] for k in KNOWN_DEVIATIONS):
            out.append("documented deviations (among the other failures): "
                       + ", ".join("%s %d" % (k, reasons[k]) for k in KNOWN_DEVIATIONS if reasons[k]))
    causes = top_causes(records)
    if causes:
        out.append("top causes of the other failures:")
        out.extend("  %4d  %s" % (n, cause) for cause, n in causes)
    if ref is not None:
        cmp = compare(records, ref)
        out.append("against the reference: torch's classes pass %d; ours pass %d of those, fail %d refused by "
                   "design and %d other (%.1f %% of the %d not refused by design)"
                   % (cmp["ref_passed"], cmp["ours_passed"], cmp["by_design"], cmp["other"], 100 * cmp["other_share"],
                      cmp["ref_passed"] - cmp["by_design"]))
        if cmp["missing"]:
            out.append("  %d of the reference's passes are absent from this run" % len(cmp["missing"]))
        out.extend("  torch passes, ours fails: %s" % i for i in cmp["other_ids"][:60])
        if len(cmp["other_ids"]) > 60:
            out.append("  ... and %d more (the JSON report lists them all)" % (len(cmp["other_ids"]) - 60))
    return "\n".join(out)


def summary(records, label, ref=None):
    s = {"label": label, "tests": len(records),
         "counts": {"%s/%s" % k: dict(c) for k, c in count(records).items()},
         "top_causes": [[cause, n] for cause, n in top_causes(records, 30)],
         "failures": [{k: r[k] for k in ("id", "status", "reason", "cause")} for r in records
                      if r["status"] in ("failed", "error")]}
    if ref is not None:
        s["against_reference"] = compare(records, ref)
    return s

# ---- running the suite (torch 2.x with optim_db) ----


def _stub_sibling_modules():
    """test_optim.py imports three test classes from torch's test/optim/ folder, which is not
    carried: empty stand-ins (no tests) let the file import unchanged."""
    pkg = sys.modules.setdefault("optim", types.ModuleType("optim"))
    pkg.__path__ = []
    for mod, cls in (("test_lrscheduler", "TestLRScheduler"), ("test_optim", "TestDifferentiableOptimizer"),
                     ("test_swa_utils", "TestSWAUtils")):
        m = types.ModuleType("optim." + mod)
        setattr(m, cls, type(cls, (), {"__test__": False}))
        sys.modules["optim." + mod] = m
        setattr(pkg, mod, m)


def swap_optim_db(reference):
    """Keeps the SGD, Adam and AdamW entries of optim_db (in place: test_optim.py imports the
    same list) and, unless reference, sets their optim_cls to renaissance.torch's classes.
    Returns {name: class} as set."""
    from torch.testing._internal import common_optimizers as co
    kept = [info for info in co.optim_db if info.optim_cls.__name__ in KINDS]
    if sorted(i.optim_cls.__name__ for i in kept) != sorted(KINDS):
        raise SystemExit("optim_db has no single SGD, Adam and AdamW entries: %s" % [i.optim_cls for i in kept])
    co.optim_db[:] = kept
    if not reference:
        import renaissance.torch as rt
        for info in kept:
            info.optim_cls = getattr(rt, info.optim_cls.__name__)
    return {i.optim_cls.__name__: i.optim_cls for i in co.optim_db}


def _state_dtype_reason(excinfo):
    """'fp32 state' when a failure is _compare_between's comparison of one optimizer state tensor
    (test_optim.py: `tracker.pop_check_set(new_p_state[k], self)`) that is float32 for a bfloat16 or
    float16 parameter and agrees with its reference at the tolerance torch's own test applies to
    its state of that parameter (the state in the parameter's dtype: both rounded to it, compared
    with assertEqual's defaults for the dtype), else None. torch keeps that state in the
    parameter's dtype and compares it at that dtype's tolerance; renaissance.torch keeps it in
    float32 (docs/python.md), compared at float32's, so a gradient that differs by one bf16 ulp
    between the two runs (a CPU and a CUDA backward) fails only here. Anything else (a parameter
    mismatch, a state of the parameter's dtype, a difference beyond the 16-bit tolerance) stays a
    failure of the rest."""
    import linecache
    import torch
    tb, frames = excinfo.tb, []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    compare = [f for f in frames if f.f_code.co_name == "_compare_between"]
    check = [f for f in frames if f.f_code.co_name == "pop_check_set"]
    if not compare or not check:
        return None
    frame = compare[-1]
    if "new_p_state[k]" not in linecache.getline(frame.f_code.co_filename, frame.f_lineno):
        return None  # not the state comparison (the parameters', or another assertion)
    loc, ref = frame.f_locals, check[-1].f_locals.get("ref")
    p, k, state = loc.get("new_p"), loc.get("k"), loc.get("new_p_state")
    if not (isinstance(p, torch.Tensor) and isinstance(ref, torch.Tensor) and isinstance(state, dict)):
        return None
    t = state.get(k)
    if not isinstance(t, torch.Tensor) or p.dtype not in (torch.bfloat16, torch.float16) \
            or t.dtype != torch.float32 or ref.dtype != torch.float32:
        return None
    try:
        torch.testing.assert_close(t.detach().cpu().to(p.dtype), ref.detach().cpu().to(p.dtype))
    except AssertionError:
        return None
    return "fp32 state"


def _cause_plugin():
    """pytest plugin (made once pytest is imported): records _state_dtype_reason's verdict of a
    failed test as the junit property REASON_PROPERTY, which read_junit reads back."""
    import pytest

    class _CausePlugin:
        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_makereport(self, item, call):
            outcome = yield
            rep = outcome.get_result()
            if rep.when == "call" and rep.failed and call.excinfo is not None:
                reason = _state_dtype_reason(call.excinfo)
                if reason:
                    # junit writes the properties of the teardown report, which copies the item's.
                    item.user_properties.append((REASON_PROPERTY, reason))
                    rep.user_properties.append((REASON_PROPERTY, reason))

    return _CausePlugin()


class _SwapCheck:
    """pytest plugin: after collection, the test module's optim_db must hold exactly the classes
    set by swap_optim_db, and each class must have collected tests."""

    def __init__(self, expected):
        self.expected = expected
        self.problem = None

    def pytest_collection_modifyitems(self, session, config, items):
        mods = {id(it.module): it.module for it in items if getattr(it, "module", None) is not None}
        seen = collections.Counter()
        dbs = [getattr(mod, "optim_db", None) for mod in mods.values()]
        if not any(db is not None for db in dbs):
            self.problem = "no collected test module has an optim_db"
        for db in dbs:
            if db is None:
                continue
            got = {i.optim_cls.__name__: i.optim_cls for i in db}
            if got != self.expected:
                self.problem = "the test module's optim_db holds %s, expected %s" % (got, self.expected)
        for it in items:
            seen[parse_test_name(it.cls.__name__ if it.cls else "", it.name)[0]] += 1
        missing = [k for k in KINDS if seen[k] == 0]
        if not mods or missing:
            self.problem = self.problem or "no tests collected for %s" % (missing or "any class")
        if self.problem:
            raise SystemExit("swap check failed: " + self.problem)
        print("swap check: optim_db classes %s; tests collected %s"
              % ({k: "%s.%s" % (v.__module__, v.__qualname__) for k, v in self.expected.items()}, dict(seen)))


def run(args):
    if not os.path.exists(args.test_file):
        raise SystemExit("no %s: fetch torch's test/test_optim.py there (docs/python.md)" % args.test_file)
    # Without torch's "To execute this test, run ..." lines the failure message is the exception
    # (read when torch's common_utils is imported).
    os.environ["PYTORCH_PRINT_REPRO_ON_FAILURE"] = "0"
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    _stub_sibling_modules()
    expected = swap_optim_db(args.reference)
    import pytest
    label = "%s %s classes on %s (torch %s)" % ("torch's" if args.reference else "renaissance.torch's",
                                                "/".join(KINDS), args.device, torch.__version__)
    print("== " + label, flush=True)
    node = "%s::TestOptimRenewed%s" % (args.test_file, args.device.upper())
    pytest_args = [node, "-q", "--tb=short", "-p", "no:cacheprovider", "--junitxml", args.junit, "-o", "junit_family=xunit1",
                   "--rootdir", os.path.dirname(os.path.abspath(args.test_file))]
    if args.k:
        pytest_args += ["-k", args.k]
    sys.argv = [sys.argv[0]]  # torch's common_utils parses sys.argv when imported
    check = _SwapCheck(expected)

    # A time limit's SIGTERM (or SIGINT, which a background job may have ignored) stops pytest as
    # Ctrl-C does: the junit report of the tests run so far is still written.
    def interrupt(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    rc = pytest.main(pytest_args, plugins=[check, _cause_plugin()])
    if check.problem or not os.path.exists(args.junit):
        print("no report: %s" % (check.problem or "pytest rc %s" % rc))
        return 3
    records = read_junit(args.junit)
    ref = read_junit(args.against) if args.against else None
    if rc == pytest.ExitCode.INTERRUPTED:
        label += ", INTERRUPTED: the tests run so far"
    print(format_report(records, label, ref))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary(records, label, ref), f, indent=1)
    # pytest's 1 (some tests failed) is the measurement, not a harness failure.
    return 0 if rc in (0, 1) else int(rc)


def report(args):
    records = read_junit(args.junit)
    ref = read_junit(args.against) if args.against else None
    label = args.label or os.path.basename(args.junit)
    print(format_report(records, label, ref))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary(records, label, ref), f, indent=1)
    return 0


def table(args):
    rows, combined, headline = [], {}, []
    rows.append("%-5s %-6s %6s %6s %7s %6s %9s %6s  %s" % ("dev", "run", "passed", "failed", "skipped", "errors",
                                                        "by_design", "other", "torch passes, ours fails"))
    for spec in args.pairs:
        device, ref_path, ours_path = spec.split(":", 2)
        ref = read_junit(ref_path) if os.path.exists(ref_path) else None
        ours = read_junit(ours_path) if os.path.exists(ours_path) else None
        for run_name, recs in (("torch", ref), ("ours", ours)):
            if recs is None:
                rows.append("%-5s %-6s (no report)" % (device, run_name))
                if run_name == "ours":
                    headline.append("%s: no report of ours" % device)
                continue
            c = collections.Counter()
            for k in count(recs).values():
                c.update(k)
            cmp_text = ""
            if run_name == "ours" and ref is not None:
                cmp = compare(recs, ref)
                cmp_text = "%d by design, %d other (%.1f %%)" % (cmp["by_design"], cmp["other"], 100 * cmp["other_share"])
                headline.append("%s: torch %d passed, ours %d of those; %d by design, %d other (%.1f %%)"
                                % (device, cmp["ref_passed"], cmp["ours_passed"], cmp["by_design"], cmp["other"],
                                   100 * cmp["other_share"]))
            elif run_name == "ours":
                headline.append("%s: ours %d passed of %d (no reference)" % (device, c["passed"], len(recs)))
            rows.append("%-5s %-6s %6d %6d %7d %6d %9d %6d  %s" % (device, run_name, c["passed"], c["failed"],
                                                                c["skipped"], c["errors"], c["by_design"], c["other"],
                                                                cmp_text))
        combined[device] = {"torch": summary(ref, "torch " + device) if ref is not None else None,
                            "ours": summary(ours, "ours " + device, ref) if ours is not None else None}
    print("\n".join(rows))
    print("torchsuite: " + ("; ".join(headline) or "no report"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(combined, f, indent=1)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run TestOptimRenewed with the swapped (or, --reference, torch's) classes")
    r.add_argument("--reference", action="store_true", help="torch's own classes, no swap")
    r.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    r.add_argument("--test-file", default=DEFAULT_TEST_FILE)
    r.add_argument("--junit", required=True)
    r.add_argument("--json")
    r.add_argument("--against", help="the reference run's junit file: print the comparison")
    r.add_argument("-k", help="pytest -k expression (a subset, for trying the harness)")
    p = sub.add_parser("report", help="counts from a junit file (no torch needed)")
    p.add_argument("junit")
    p.add_argument("--against")
    p.add_argument("--json")
    p.add_argument("--label")
    t = sub.add_parser("table", help="the short table of reference and ours per device (no torch needed)")
    t.add_argument("pairs", nargs="+", metavar="DEVICE:REF.xml:OURS.xml")
    t.add_argument("--json", help="the summaries of every run, in one file")
    args = ap.parse_args(argv)
    return {"run": run, "report": report, "table": table}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
