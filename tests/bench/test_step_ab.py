#!/usr/bin/env python3
"""bench/step_ab.py against stand-in builds: a bench_step that records its command line and prints
rows whose ms_per_step says which build ran (base 2 ms, new 3 ms; synced 4 and 6), and a CLI that
prints a small kind table. Checks the compare rows' command lines (compare_torch.py's own, base and
new alternating first by round), the new/base ratio of the medians and its bootstrap interval, the
pooling of earlier runs' JSON files, and that SIGTERM leaves the table and the JSON of the finished
rounds only. Standard library only (ctest runs it with python3).
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEP_AB = os.path.join(ROOT, "bench", "step_ab.py")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import compare_torch  # noqa: E402

KINDS = [{"name": "adamw", "family": "adam"}, {"name": "sgd_momentum", "family": "sgd"},
         {"name": "muon", "family": "muon"}]

FAKE_BENCH_STEP = r'''#!/usr/bin/env python3
import json, os, sys, time
build = os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.environ["STEP_AB_TEST_LOG"], "a") as f:
    f.write(json.dumps([build] + sys.argv[1:]) + "\n")
time.sleep(float(os.environ.get("STEP_AB_TEST_SLEEP", "0")))
a = sys.argv[1:]
kinds = a[a.index("--kinds") + 1].split(",")
layouts = a[a.index("--layouts") + 1].split(",")
ms = 2.0 if build == "base" else 3.0
for layout in layouts:
    for kind in kinds:
        for check in (True, False):
            print(json.dumps({"layout": layout, "optimizer": kind, "check_finite": check, "ms_per_step": ms,
                              "ms_per_step_synced": 2 * ms, "share_of_limit": 0.5}))
'''


class StepAbTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        for build in ("base", "new"):
            os.makedirs(os.path.join(self.dir, build, "bench"))
            path = os.path.join(self.dir, build, "bench", "bench_step")
            with open(path, "w") as f:
                f.write(FAKE_BENCH_STEP)
            os.chmod(path, 0o755)
        os.makedirs(os.path.join(self.dir, "new", "cli"))
        cli = os.path.join(self.dir, "new", "cli", "renaissance")
        with open(cli, "w") as f:
            f.write("#!/bin/sh\necho '%s'\n" % json.dumps(KINDS))
        os.chmod(cli, 0o755)
        self.log = os.path.join(self.dir, "argv.jsonl")
        self.json = os.path.join(self.dir, "ab.json")
        self.env = dict(os.environ, STEP_AB_TEST_LOG=self.log)

    def tearDown(self):
        self.tmp.cleanup()

    def build(self, name):
        return os.path.join(self.dir, name, "bench", "bench_step")

    def step_ab(self, *extra, sleep="0"):
        return [sys.executable, STEP_AB, self.build("base"), self.build("new"), "--json", self.json] + list(extra), \
            dict(self.env, STEP_AB_TEST_SLEEP=sleep)

    def recorded(self):
        with open(self.log) as f:
            return [json.loads(line) for line in f]

    def test_compare_rows_run_compare_torchs_command_lines_alternating_first_build(self):
        cmd, env = self.step_ab("--rows", "compare", "--backend", "cpu", "--threads", "3", "--replays", "4",
                                "--rounds", "2", "--kinds", "adamw,adamw+clip")
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        compare_torch.KIND_TABLE.update({k["name"]: k for k in KINDS})
        expected = []
        for first, second in (("base", "new"), ("new", "base")):
            for layout in ("resnet50", "gpt2_small"):
                for build in (first, second):
                    for _, argv in compare_torch.bench_step_commands(
                            os.path.join(self.dir, build), "cpu", layout, ["adamw", "adamw+clip"], 4, 3, "enqueued", 1.0):
                        expected.append([build] + argv[1:])
        self.assertEqual(self.recorded(), expected)
        # 2 layouts x 2 kinds x 2 checks, enqueued only on the CPU; every ratio is 3 ms / 2 ms.
        self.assertIn("new/base median ratios: max 1.500, min 1.500 over 8 rows", out)
        self.assertNotIn("synced", out)

    def test_compare_rows_on_cuda_time_both_methods_and_leave_muon_out(self):
        cmd, env = self.step_ab("--rows", "compare", "--backend", "cuda", "--rounds", "1", "--layouts", "resnet50")
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        kinds_run = sorted(a[a.index("--kinds") + 1] + (" clip" if "--max-grad-norm" in a else "")
                           for a in self.recorded())
        self.assertEqual(kinds_run, ["adamw clip", "adamw clip", "adamw,sgd_momentum", "adamw,sgd_momentum"])
        self.assertTrue(all(a[a.index("--timing") + 1] == "both" for a in self.recorded()))
        # (adamw, sgd_momentum, adamw+clip) x 2 checks x (enqueued, synced); synced is 6 / 4 ms.
        self.assertIn("over 12 rows", out)
        self.assertIn("resnet50     adamw+clip    synced   check    new      6.000    6.000", out)

    def test_from_json_pools_the_files_and_prints_the_ratio_with_its_interval(self):
        """Two runs' values of one row pooled: base 2 ms five times, new 3, 3, 3 (first file) and 2, 2
        (second): the medians' ratio 1.5 over 5 values a build, and an interval from 1.0 (resamples
        with three or more 2 ms values of new) to 1.5; no bench_step runs."""
        files = []
        for i, new in enumerate(([3.0, 3.0, 3.0], [2.0, 2.0])):
            files.append(os.path.join(self.dir, "run%d.json" % i))
            base = [2.0] * len(new)
            with open(files[-1], "w") as f:
                json.dump({"resnet50 adamw fp32 check base": [[x, 0.5] for x in base],
                           "resnet50 adamw fp32 check new": [[x, 0.5] for x in new]}, f)
        out = subprocess.run([sys.executable, STEP_AB, "--from-json", ",".join(files)], env=self.env,
                             capture_output=True, text=True, check=True).stdout
        self.assertFalse(os.path.exists(self.log), "bench_step ran")
        row = [line for line in out.splitlines() if line.startswith("resnet50") and " new " in line][0]
        self.assertEqual(row.split()[-3:], ["1.500", "1.000-1.500", "5"], row)
        self.assertIn("new/base median ratios: max 1.500, min 1.500 over 1 rows", out)
        self.assertIn("new/base 95% intervals: highest upper end 1.500, lowest lower end 1.000", out)

    def test_identical_values_give_an_interval_of_one_point(self):
        cmd, env = self.step_ab("--configs", "fp32", "--rounds", "2")
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        rows = [line for line in out.splitlines() if line.startswith("resnet50") and " new " in line]
        self.assertEqual(len(rows), 2)
        for row in rows:
            self.assertEqual(row.split()[-3:], ["1.500", "1.500-1.500", "2"], row)
        self.assertIn("new/base 95% intervals: highest upper end 1.500, lowest lower end 1.500", out)

    def test_sigterm_leaves_the_table_and_json_of_the_finished_rounds(self):
        cmd, env = self.step_ab("--configs", "fp32,bf16", "--rounds", "100", sleep="0.15")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while time.time() < deadline and not os.path.exists(self.json):
            time.sleep(0.05)
        self.assertTrue(os.path.exists(self.json), "no JSON after the first round")
        time.sleep(0.4)  # into the second round, which must not count
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("stopped by SIGTERM", out)
        with open(self.json) as f:
            saved = json.load(f)
        finished = int(out.split("the table holds the ")[1].split()[0])
        self.assertGreaterEqual(finished, 1)
        self.assertEqual(sorted(len(v) for v in saved.values()), [finished] * 8)
        self.assertIn("new/base median ratios: max 1.500, min 1.500 over 4 rows", out)
        for line in out.splitlines():
            if line.startswith("resnet50"):
                self.assertEqual(int(line.split()[-1]), finished, line)


if __name__ == "__main__":
    unittest.main()
