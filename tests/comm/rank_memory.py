#!/usr/bin/env python3
"""ctest helper (docs/distributed.md "Memory per rank"): a rank of a 2-way sharded run
holds W and G whole and only its half of M and V, and its peak RSS shows it.

resnet50 with AdamW (P = 25.6 M parameters, four families W, G, M, V). The expected sizes come from
P as `renaissance layouts` lists it, not from the code under test:
  - `arena_bytes_per_rank` of the plain run minus that of rank 0 at K = 2 is 2 families x 4 bytes
    x P/2 = 4P bytes, within what the tile-aligned cut and the region padding allow;
  - the peak RSS of every rank of `mpirun -np 2 ... --grad-reduce ordered` (the default mode, with
    the gradient all-to-all) stays within 1.15x of (2 + 2/2) x 4 x P = 12P bytes, which the whole
    state (16P) would exceed.

    rank_memory.py CLI MPIRUN
"""
import json
import os
import re
import subprocess
import sys

LAYOUT = "resnet50"
LIMIT = 1.15
GRAD_TILE = 16384  # a cut lies on a grad-norm tile boundary (math/norm_reduction.h)


def run(cmd, env):
    # Each run in its own child interpreter: RUSAGE_CHILDREN there is the largest of its
    # descendants (mpirun and both ranks), i.e. the peak RSS of the biggest rank.
    code = ("import resource, subprocess, sys\n"
            "r = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE)\n"
            "sys.stderr.write(r.stderr.decode())\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if r.returncode == 0 else -1)\n"
            "print(r.stdout.decode())\n")
    out = subprocess.run([sys.executable, "-c", code] + cmd, check=True, stdout=subprocess.PIPE, env=env, text=True).stdout
    first, rest = out.split("\n", 1)
    if int(first) < 0:
        sys.exit(f"{' '.join(cmd)} failed")
    return int(first) * 1024, json.loads(rest.strip().splitlines()[-1])


def main():
    cli, mpirun = sys.argv[1], sys.argv[2]
    listing = subprocess.run([cli, "layouts"], check=True, stdout=subprocess.PIPE, text=True).stdout
    m = re.search(rf"^{LAYOUT}\s+\d+\s+(\d+)", listing, re.M)
    if not m:
        sys.exit(f"`renaissance layouts` does not list {LAYOUT}:\n{listing}")
    P = int(m.group(1))
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMP_NUM_THREADS": "1",
                "OMPI_MCA_btl_vader_single_copy_mechanism": "none"})
    args = ["run", "--model", LAYOUT, "--optimizer", "adamw", "--steps", "2", "--threads", "1", "--json"]
    plain_rss, plain = run([cli] + args, env)
    rank_rss, sharded = run([mpirun, "--oversubscribe", "-np", "2", cli] + args +
                            ["--distributed", "mpi", "--grad-reduce", "ordered"], env)
    whole, per_rank = plain["arena_bytes_per_rank"], sharded["arena_bytes_per_rank"]
    saved = whole - per_rank
    # The cut may sit up to one grad-norm tile off the middle; six roles pad by < 64 elements.
    slack = 2 * 4 * (GRAD_TILE + 6 * 64)
    print(f"{LAYOUT} adamw, P = {P}: arena {whole} bytes whole, {per_rank} on rank 0 of 2 (saved {saved}, "
          f"expected 4P = {4 * P} +- {slack})")
    print(f"peak RSS: plain run {plain_rss} bytes ({plain_rss / (16 * P):.3f} x 16P), "
          f"largest rank of 2 {rank_rss} bytes ({rank_rss / (12 * P):.3f} x 12P, limit {LIMIT})")
    failed = False
    if abs(saved - 4 * P) > slack:
        print(f"FAIL: rank 0 of 2 saves {saved} bytes, not 4P = {4 * P}")
        failed = True
    if rank_rss > LIMIT * 12 * P:
        print(f"FAIL: a rank of 2 peaks at {rank_rss} bytes, more than {LIMIT} x 12P = {LIMIT * 12 * P:.0f}")
        failed = True
    if sharded["fingerprint"] == "" or sharded.get("world_size") != 2:
        print(f"FAIL: the sharded run's JSON lacks its fingerprint or world_size: {sharded}")
        failed = True
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
