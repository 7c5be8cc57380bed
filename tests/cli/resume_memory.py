#!/usr/bin/env python3
"""ctest helper: the peak RSS of `renaissance run --resume` stays within 1.2x
of a plain run of the same model (a resume used to read the whole checkpoint, decode a copy and
keep a backup: 3.5x). The model is a generated layout of 32M parameters (AdamW: 512 MB arena,
384 MB of state), large enough that any whole-file copy shows.

    resume_memory.py CLI WORK
"""
import json
import os
import resource
import subprocess
import sys


def peak_rss_kb(cmd):
    # Each measurement in its own child interpreter: RUSAGE_CHILDREN is the max over all children.
    code = ("import resource, subprocess, sys\n"
            "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
            "sys.stderr.write(r.stderr.decode())\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if r.returncode == 0 else -r.returncode - 1000)\n")
    out = subprocess.run([sys.executable, "-c", code] + cmd, check=True, stdout=subprocess.PIPE).stdout
    kb = int(out.decode().strip())
    if kb < 0:
        sys.exit(f"{' '.join(cmd)} failed")
    return kb


def main():
    cli, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    layout = os.path.join(work, "m32.json")
    params = [{"name": f"w{i}", "shape": [2048, 4096], "role": "deep_conv"} for i in range(4)]
    with open(layout, "w") as f:
        json.dump({"name": "m32", "params": params}, f)
    ckpt = os.path.join(work, "m32.ckpt")
    if os.path.exists(ckpt):
        os.remove(ckpt)
    base = [cli, "run", "--model", layout, "--backend", "cpu", "--threads", "1"]
    peak_rss_kb(base + ["--steps", "1", "--checkpoint", ckpt])
    plain = peak_rss_kb(base + ["--steps", "2"])
    resumed = peak_rss_kb(base + ["--steps", "2", "--resume", ckpt])
    ratio = resumed / plain
    print(f"peak RSS: plain run {plain} kB, resume {resumed} kB, ratio {ratio:.2f} (limit 1.2)")
    if ratio > 1.2:
        sys.exit("a resume needs more than 1.2x the memory of a plain run")


if __name__ == "__main__":
    main()
