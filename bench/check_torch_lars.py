#!/usr/bin/env python3
"""Checks that bench/torch_lars.py (the torch LARS that compare_torch.py times) has this
library's LARS semantics: it replays every LARS case of testdata/replay (plain and Nesterov) in float64 on the
CPU (per-step lr and loss scale, the step with a non-finite gradient skipped as a whole) and
compares the weights and momenta with expected.safetensors, the float64 reference that
scripts/make_testdata.py computes from docs/math.md. The norms are summed in another order than
the reference's, hence a relative tolerance, far below what a semantic difference gives (timm's
placement of lr, a missing clamp or decay on the bias-like group: 1e-3 and more).

    /usr/bin/python3 bench/check_torch_lars.py        (or: pytest bench/check_torch_lars.py)
"""
import json
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_lars import ForeachLars  # noqa: E402

REPLAY = os.path.join(os.path.dirname(HERE), "testdata", "replay")
WEIGHT_ROLES = ("fc_weight", "first_conv", "deep_conv")
TOLERANCE = 1e-12


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = {"F32": "<f4", "F64": "<f8"}[info["dtype"]]
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=dtype).reshape(info["shape"])
    return out


def replay(case_name):
    """Runs the case through ForeachLars; returns (worst relative difference, its tensor name)."""
    d = os.path.join(REPLAY, case_name)
    with open(os.path.join(d, "case.json")) as f:
        case = json.load(f)
    opt, params = case["optimizer"], case["params"]
    init = read_safetensors(os.path.join(d, "init.safetensors"))
    grads = read_safetensors(os.path.join(d, "grads.safetensors"))
    expected = read_safetensors(os.path.join(d, "expected.safetensors"))
    tensors = {p["name"]: torch.tensor(init[p["name"]].astype(np.float64)) for p in params}
    weights = [tensors[p["name"]] for p in params if p["role"] in WEIGHT_ROLES]
    biases = [tensors[p["name"]] for p in params if p["role"] not in WEIGHT_ROLES]
    lars = ForeachLars(weights, biases, lr=opt["lr"], momentum=opt["momentum"], weight_decay=opt["weight_decay"],
                       trust_coefficient=opt["trust_coefficient"], eps=opt["eps"], nesterov=opt["kind"].endswith("nesterov"))
    applied = 0
    for t in range(case["steps"]):
        g = {p["name"]: grads[f"step{t}/{p['name']}"].astype(np.float64) for p in params}
        if not all(np.all(np.isfinite(a)) for a in g.values()):
            continue  # the library skips the whole step (docs/math.md, the skip rule)
        for name, a in g.items():
            tensors[name].grad = torch.tensor(a)
        lars.lr = case["lr_per_step"][t]
        lars.step(inv_scale=1.0 / case["loss_scale_per_step"][t])
        applied += 1
    assert applied == case["steps"] - 1, f"{case_name}: expected one skipped step, applied {applied}"
    momentum = {}
    for p, m in zip([p for p in params if p["role"] in WEIGHT_ROLES], lars.mw):
        momentum[p["name"]] = m
    for p, m in zip([p for p in params if p["role"] not in WEIGHT_ROLES], lars.mb):
        momentum[p["name"]] = m
    worst, where = 0.0, None
    for p in params:
        for key, ours in ((p["name"], tensors[p["name"]]), ("m/" + p["name"], momentum[p["name"]])):
            ref = expected[key].astype(np.float64).reshape(-1)
            got = ours.numpy().reshape(-1)
            if ref.size == 0:
                continue
            scale = np.max(np.abs(ref))
            diff = float(np.max(np.abs(got - ref)) / (scale if scale > 0 else 1.0))
            if diff > worst:
                worst, where = diff, key
    return worst, where


def lars_cases():
    """The replay cases of the LARS kinds (whose names start with "lars"), in name order."""
    cases = []
    for name in sorted(os.listdir(REPLAY)):
        path = os.path.join(REPLAY, name, "case.json")
        if os.path.isfile(path):
            with open(path) as f:
                if json.load(f)["optimizer"]["kind"].startswith("lars"):
                    cases.append(name)
    assert len(cases) >= 2, f"expected the plain and the Nesterov LARS cases in {REPLAY}, found {cases}"
    return cases


def test_lars_cases():
    for name in lars_cases():
        worst, where = replay(name)
        assert worst <= TOLERANCE, f"{name}: {where} differs by {worst:.3g} (relative)"


if __name__ == "__main__":
    failed = False
    for name in lars_cases():
        worst, where = replay(name)
        ok = worst <= TOLERANCE
        failed |= not ok
        print(f"{name}: worst relative difference {worst:.3g} ({where}) {'ok' if ok else 'FAILED'} (tolerance {TOLERANCE:g})")
    sys.exit(1 if failed else 0)
