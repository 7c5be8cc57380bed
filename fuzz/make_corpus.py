#!/usr/bin/env python3
"""Regenerates the seed corpora of fuzz/corpus/ (except fuzz_checkpoint's valid seeds, which the
fuzz_checkpoint binary writes itself: RENAISSANCE_FUZZ_WRITE_SEEDS=DIR). Seeds are real inputs
cut down to a few hundred bytes (small seeds keep libFuzzer's max_len and exec time low) plus a
few broken ones, so mutation starts both inside and just outside the accepted language. The real
inputs are the repository's own: the replay cases of testdata/replay (scripts/make_testdata.py)
and the layouts of data/layouts.

    fuzz/make_corpus.py
"""
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPLAY = os.path.join(ROOT, "testdata", "replay")
CORPUS = os.path.join(ROOT, "fuzz", "corpus")
CASES = ["adamw", "lars", "sgd_momentum_decoupled"]
DTYPE_SIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2,
              "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}


def put(target, name, data):
    os.makedirs(os.path.join(CORPUS, target), exist_ok=True)
    with open(os.path.join(CORPUS, target, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def read_st(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for k, v in header.items():
        if k != "__metadata__":
            b, e = v["data_offsets"]
            out[k] = (v["dtype"], v["shape"], data[b:e])
    return out, header.get("__metadata__")


def write_st(tensors, metadata=None):
    header, blob = {}, b""
    for name in sorted(tensors):
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text.encode() + blob


def small(tensors, limit=16, count=4):
    keep = {k: v for k, v in tensors.items() if len(v[2]) // DTYPE_SIZE[v[0]] <= limit}
    return dict(sorted(keep.items())[:count])


def safetensors_seeds():
    t = "fuzz_safetensors"
    for case in CASES:
        for kind in ["init", "grads", "expected"]:
            tensors, meta = read_st(os.path.join(REPLAY, case, kind + ".safetensors"))
            put(t, f"{case}_{kind}.safetensors", write_st(small(tensors), meta))
    # Every dtype, a scalar, an empty tensor and metadata: the whole accepted language.
    every = {f"t_{d.lower()}": (d, [2], bytes(range(2 * s))) for d, s in DTYPE_SIZE.items()}
    every["scalar"] = ("F64", [], struct.pack("<d", 1.5))
    every["empty"] = ("F32", [0, 3], b"")
    every["steps"] = ("I64", [3], struct.pack("<3q", 0, 1, -1))
    put(t, "every_dtype.safetensors", write_st(every, {"format": "pt", "note": "seed"}))
    valid = write_st({"a": ("F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)), "b": ("F64", [1], struct.pack("<d", 2))})
    put(t, "broken_truncated.safetensors", valid[:-5])
    put(t, "broken_header_past_end.safetensors", struct.pack("<Q", 1 << 20) + valid[8:])
    n = struct.unpack("<Q", valid[:8])[0]
    put(t, "broken_overlap.safetensors", valid[:8] + valid[8:8 + n].replace(b"[16,24]", b"[8,16]") + valid[8 + n:])
    put(t, "broken_dtype.safetensors", valid.replace(b'"F64"', b'"F65"'))
    put(t, "broken_shape_overflow.safetensors",
        write_st({"a": ("F32", [2, 2], b"\0" * 16)}).replace(b"[2,2]", b"[4611686018427387904,4]"))


def replay_seeds():
    t = "fuzz_replay_case"
    for case in CASES:
        text = open(os.path.join(REPLAY, case, "case.json")).read()
        put(t, case + ".json", json.dumps(json.loads(text), separators=(",", ":")))
    base = json.loads(open(os.path.join(REPLAY, CASES[0], "case.json")).read())
    base["params"] = base["params"][:3]
    with_lists = dict(base, lr_per_step=[1e-3, 2e-3, 0, 1e-4, 5e-4], loss_scale_per_step=[1, 2, 4, 0.5, 1024])
    put(t, "per_step_lists.json", json.dumps(with_lists))
    sgd = dict(base, name="sgd_l2", optimizer={"kind": "sgd_nesterov", "lr": 0.1, "momentum": 0.9,
                                              "weight_decay": 1e-4, "weight_decay_mode": "l2"})
    put(t, "sgd_l2.json", json.dumps(sgd))
    put(t, "broken_format.json", json.dumps(dict(base, format="renaissance-replay/2")))
    put(t, "broken_lr_count.json", json.dumps(dict(base, lr_per_step=[1e-3])))
    put(t, "broken_kind.json", json.dumps(dict(base, optimizer={"kind": "adamax"})))
    put(t, "broken_not_json.json", json.dumps(base)[:100])
    # Format 2 with None gradients: no_grad_per_step and per-tensor step counts.
    frozen = json.loads(open(os.path.join(ROOT, "testdata", "recorded", "torch_adamw_frozen_cpu", "case.json")).read())
    put(t, "no_grad_format2.json", json.dumps(frozen, separators=(",", ":")))


def layout_seeds():
    t = "fuzz_layout"
    for f in sorted(os.listdir(os.path.join(ROOT, "data", "layouts"))):
        layout = json.load(open(os.path.join(ROOT, "data", "layouts", f)))
        layout["params"] = layout["params"][:8]
        put(t, f, json.dumps(layout, separators=(",", ":")))
    good = {"name": "tiny", "source": "seed", "description": "every role, a scalar and an empty tensor",
            "params": [{"name": "w", "shape": [3, 2, 3, 3], "role": "first_conv"},
                       {"name": "g", "shape": [3], "role": "bn_weight"}, {"name": "b", "shape": [3], "role": "bn_bias"},
                       {"name": "d", "shape": [4, 3, 1, 1], "role": "deep_conv"},
                       {"name": "f", "shape": [2, 4], "role": "fc_weight"}, {"name": "fb", "shape": [], "role": "fc_bias"},
                       {"name": "e", "shape": [0, 7], "role": "deep_conv"}]}
    put(t, "tiny.json", json.dumps(good))
    dup = dict(good, params=good["params"][:2] + good["params"][:1])
    put(t, "broken_duplicate.json", json.dumps(dup))
    put(t, "broken_role.json", json.dumps(good).replace("bn_bias", "bn_biass"))
    put(t, "broken_shape.json", json.dumps(good).replace("[3, 2, 3, 3]", "[3, -2, 3, 3]"))
    put(t, "broken_huge.json", json.dumps(good).replace("[0, 7]", "[4294967296, 4294967296]"))


def checkpoint_broken_seeds():
    t = "fuzz_checkpoint"
    src = os.path.join(CORPUS, t, "adamw.ckpt")
    if not os.path.exists(src):
        print("no fuzz_checkpoint/adamw.ckpt yet: run RENAISSANCE_FUZZ_WRITE_SEEDS first", file=sys.stderr)
        return
    good = open(src, "rb").read()
    put(t, "broken_truncated.ckpt", good[: len(good) // 2])
    put(t, "broken_magic.ckpt", b"\x89RNCKPX\n" + good[8:])
    flipped = bytearray(good)
    flipped[len(good) // 3] ^= 0x10
    put(t, "broken_bitflip.ckpt", bytes(flipped))


if __name__ == "__main__":
    safetensors_seeds()
    replay_seeds()
    layout_seeds()
    checkpoint_broken_seeds()
