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
per-implementation step functions, which renaissance.torch does not have: docs/python.md) and the rest,
with the most frequent causes of the rest.
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
DESIGN_REASONS = ("differentiable", "float64", "sparse")
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


def design_reason(name, exc):
    """'differentiable', 'float64' or 'sparse' when the failure is one renaissance.torch makes by
    design, else None. The exception's text decides, not the test's name: a test named float64 or
    sparse may fail first on another refusal (test_rosenbrock_sparse's params are float32 and its
    first configuration has SGD's dampening), which is then one of the rest."""
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
        status, exc = "passed", ""
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
            rec["reason"] = design_reason(name, exc)
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
            c["by_design" if r["reason"] else "other"] += 1
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
    by_design = [r for r in regressions if r["reason"]]
    other = [r for r in regressions if not r["reason"]]
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
    rc = pytest.main(pytest_args, plugins=[check])
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
