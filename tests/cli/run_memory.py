#!/usr/bin/env python3
"""ctest helper: the peak RSS of `renaissance run` stays within 1.15x of its
arena. `run` once kept two 256 MiB copy buffers beside the arena for a memcpy reference; the
same-traffic limit now runs in place over the arena, and nothing else of that size may come back.

The model is resnet50 with AdamW (25.6 M parameters, four families W, G, M, V: a 409 MB arena), so
the arena dominates and a stray buffer of a few tens of MB shows. The arena is taken as
parameters x 4 families x 4 bytes, the parameter count read from `renaissance layouts` (not from
the code under test's allocation); the plan's region padding only adds to the real arena, so this
bound is the stricter one. Run with the CPU backend's defaults and with the old placement
(one memset of the whole arena, no huge pages: RENAISSANCE_CPU_FIRST_TOUCH=0, _HUGEPAGES=0).

    run_memory.py CLI
"""
import os
import re
import subprocess
import sys

LIMIT = 1.15
LAYOUT = "resnet50"
FAMILIES = 4  # AdamW: W, G, M, V (kinds.h)


def peak_rss_kb(cmd, env):
    # Each measurement in its own child interpreter: RUSAGE_CHILDREN is the max over all children.
    code = ("import resource, subprocess, sys\n"
            "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
            "sys.stderr.write(r.stderr.decode())\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if r.returncode == 0 else -r.returncode - 1000)\n")
    out = subprocess.run([sys.executable, "-c", code] + cmd, check=True, stdout=subprocess.PIPE, env=env).stdout
    kb = int(out.decode().strip())
    if kb < 0:
        sys.exit(f"{' '.join(cmd)} failed")
    return kb


def main():
    cli = sys.argv[1]
    listing = subprocess.run([cli, "layouts"], check=True, stdout=subprocess.PIPE, text=True).stdout
    m = re.search(rf"^{LAYOUT}\s+\d+\s+(\d+)", listing, re.M)
    if not m:
        sys.exit(f"`renaissance layouts` does not list {LAYOUT}:\n{listing}")
    arena_kb = int(m.group(1)) * FAMILIES * 4 / 1024
    cmd = [cli, "run", "--model", LAYOUT, "--optimizer", "adamw", "--steps", "3", "--backend", "cpu", "--threads", "2"]
    failed = False
    for label, switches in (("defaults", {}),
                            ("memset, no huge pages", {"RENAISSANCE_CPU_FIRST_TOUCH": "0", "RENAISSANCE_CPU_HUGEPAGES": "0"})):
        env = dict(os.environ)
        for k in [k for k in env if k.startswith("RENAISSANCE_CPU_")]:
            del env[k]
        env.update(switches)
        peak = peak_rss_kb(cmd, env)
        ratio = peak / arena_kb
        print(f"{LAYOUT} adamw ({label}): peak RSS {peak} kB, arena >= {arena_kb:.0f} kB, ratio {ratio:.3f} (limit {LIMIT})")
        failed |= ratio > LIMIT
    if failed:
        sys.exit(f"`renaissance run` needs more than {LIMIT}x its arena")


if __name__ == "__main__":
    main()
