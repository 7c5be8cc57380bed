"""renaissance.torch.Recorder: records a renaissance.torch optimizer's steps as a replay case.

The case (format ``renaissance-replay/2``, docs/replay-format.md) holds every parameter group's
initial weights, optimizer state (M, V) and step count, each recorded step's gradients exactly as
the backward wrote them (scaled), the per-group learning rate and the loss scale of each step,
and the final fingerprint as ``expected_fingerprint``. ``renaissance replay CASE_DIR`` re-runs
the steps on any machine (a CPU-only CI, say) and fails unless it reaches the same bits: the
GPU-less-CI workflow for PyTorch users.

bf16/fp16 parameters (a model copy besides fp32 masters): the case gets the top-level keys
``precision``, ``rounding`` and ``seed``, the gradients as the backward wrote them (BF16 / F16),
the masters as the initial weights, and ``expected.safetensors`` with every parameter's final copy
``c/{name}`` (compared bit for bit by the replay). The groups of one recording must share one
precision, rounding and seed (a case has one).

Parameters whose ``.grad`` is None at a step (a frozen branch, an unused embedding): where their
Task runs with the core's per-tensor mask (renaissance.torch does, also for bf16/fp16 parameters
and under clipping and a sharded step), the step's ``no_grad_per_step`` entry names them
and the case holds no gradient for them; the groups' per-tensor step counts go in as ``initial_tensor_steps`` (where they differ
from the group's count) and ``expected_tensor_steps``. The replay masks those parameters in those
steps. Elsewhere a None gradient is refused (the case cannot describe how such a Task stepped).

Under a torch.distributed process group (renaissance.torch's ``process_group=``): every
rank of the group constructs the Recorder with the same arguments at the same point and steps as
usual; the Recorder's reads are collectives (the gathered M and V of ShardedStep::read_state,
the gathered fingerprint), so every rank must reach the constructor, each step and the finish
together. Rank 0 of the group alone checks and writes ``case_dir`` (the other ranks' ``case_dir``
is not looked at); every rank gets ``fingerprint``, and a refusal or rank 0's failure to write
raises on every rank. The case is a one-process case: ``renaissance replay CASE_DIR`` re-runs it
on one process, and its ``expected_fingerprint`` is the one-process run's (the sharded step's
bits are one process's). At the start every rank's parameters must equal rank 0's (compared by a
64-bit digest: the case holds one set).

- ``grad_reduce="replicated"``: the step's gradient is every rank's own ``.grad``, which must be
  the same on every rank; the Recorder compares the ranks' digests at each step and refuses
  when they differ, then records rank 0's.
- ``grad_reduce="ordered"``: the step's gradient is the rank-order fp32 mean of the ranks'
  gradients, (g_0 + ... + g_{K-1}) / K, rounded to nearest even into bf16/fp16 gradients. Rank 0
  gathers every rank's gradients (one collective per step, K times the gradients' bytes on rank 0)
  and records that mean, formed as the core forms it (math/rank_reduction.h); the case's
  gradients are then the mean, not rank 0's ``.grad``.
- ``grad_reduce="fast"``: refused at construction (torch's all_reduce sums in the backend's own
  order, which no case can reproduce); nothing is written.

    with Recorder(opt, "case_dir", steps=5):       # or rec = Recorder(...); it finishes by itself
        for x, y in batches:
            loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad()

It wraps ``opt.step`` (restored when it finishes) and needs from the optimizer only its groups:
``opt._renaissance_groups`` (or ``opt._bindings``), per torch param group in order, objects with
``.task`` (a ``renaissance._core.Task``, or a GroupTask: one hyperparameter group of a shared Task), ``.params`` (the torch tensors) and ``.names`` (the
task's parameter names; when absent, the task's own names in order). Everything recorded is kept
in host memory until the case is written (steps x the model's size, float32).
"""
import hashlib
import json
import os
import shutil
import tempfile

import numpy as np

from . import _core

__all__ = ["Recorder", "combine_fingerprints"]

combine_fingerprints = _core.combine_fingerprints


# A group's task is a core Task, or (renaissance.torch) a GroupTask: one hyperparameter group of
# a shared Task, which offers the same reads for its own parameters.
def _families(task):
    return _core._task_families(task) if isinstance(task, _core.Task) else task.families()


def _read(task, family, name):
    return _core._task_read(task, family, name) if isinstance(task, _core.Task) else task.read(family, name)


def _config(task):
    return _core._task_config(task) if isinstance(task, _core.Task) else task.config()


def _precision(task):
    """(precision, rounding, seed) of a group's task; ("fp32", "nearest", 0) without a model copy."""
    return str(task.precision), str(task.rounding), int(task.seed)


def _read_encoded(task, family, name):
    """Encodings (numpy uint16; uint8 for a 1-byte encoding) of a model copy ("C") or model-dtype gradient ("G")."""
    if isinstance(task, _core.Task):
        return task.get_model_copy(name) if family == "C" else task.get_grad_encoded(name)
    return task.read_encoded(family, name)


# The safetensors dtype of each precision's encodings (the precision table: "bf16" -> "BF16", ...).
_ST_DTYPE = {row["name"]: row["safetensors"] for row in _core.precisions()}

# Hyperparameters that must stay as they were for the whole recording: the case has one
# optimizer per group; only the learning rate is recorded per step. The rest of the hyperparameter
# table, the kind and the decay mode.
_FIXED = (("kind",) + tuple(h["name"] for h in _core.hyperparameters() if h["type"] == "number" and h["name"] != "lr")
          + ("weight_decay_mode",) + tuple(h["name"] for h in _core.hyperparameters() if h["type"] == "flag"))
# The table's optional keys: a case leaves them out at their default (maximize false), so that a
# case of a run that does not use them keeps the keys it always had.
_OPTIONAL = {h["name"]: h["default"] for h in _core.hyperparameters() if h["optional"]}
# What the groups of one replayed Task share besides kind and decay mode (max_grad_norm).
_TASK_WIDE = tuple(h["name"] for h in _core.hyperparameters() if h["task_wide"])


def _tensor_steps(task):
    """Each parameter's own applied-step count where the group's Task runs with the per-tensor
    mask (TaskOptions::tensor_mask), else None (every parameter has the Task's count)."""
    if isinstance(task, _core.Task):
        try:
            return [int(s) for s in task.tensor_steps]
        except Exception:  # the core refuses tensor_steps without the mask
            return None
    # A GroupTask of renaissance.torch: its SharedTask always runs with the mask.
    binding = getattr(task, "_b", None)
    if binding is None:
        return None
    counts = task.shared.tensor_steps
    return [int(counts[i]) for i in binding.ids]


def _core_task(task):
    """The core Task that steps a group: a GroupTask's shared Task, or the Task itself."""
    core = getattr(task, "shared", None)
    return task if core is None else core


def _to_numpy(t):
    """A host copy of a torch gradient (the copy matters: arena views change at the next step):
    float32, or the encodings of a gradient in a precision table row's torch dtype (bf16, fp16, ...)
    as unsigned integers of the row's bytes (uint16; uint8 for a 1-byte encoding), bit for bit."""
    import torch
    t = t.detach().to("cpu").contiguous()
    rows = {row["torch_dtype"]: row for row in _core.precisions() if row["name"] != "fp32"}
    row = rows.get(str(t.dtype).replace("torch.", ""))
    if row is not None:
        # torch has no uint16 before 2.3: the 2-byte encodings go through int16.
        signed = {1: torch.int8, 2: torch.int16}[row["bytes"]]
        return t.view(signed).numpy().view("uint%d" % (8 * row["bytes"])).copy()
    a = t.numpy()
    if str(a.dtype) != "float32":
        names = ["float32"] + [r["name"] for r in rows.values()]
        raise ValueError(f"Recorder: a {a.dtype} gradient; the replay format holds "
                         f"{', '.join(names[:-1])} and {names[-1]}")
    return a.copy()


def _sync(groups):
    """Waits for the device: the core's host reads must see what torch's streams queued (the
    optimizer's copies in, the step ordered on torch's stream). A recording may synchronise."""
    for g in groups:
        for p in g.params:
            if p.device.type == "cuda":
                import torch
                torch.cuda.synchronize(p.device)
                return


def _torch_loss_scale(opt, kwargs):
    """The loss scale torch's GradScaler handed to this step, or None when it handed none.

    torch 1.13 passes ``grad_scaler=`` (after ``scaler.unscale_(opt)`` the gradients are already
    unscaled: scale 1); torch 2.x sets ``opt.grad_scale`` (None once unscaled)."""
    scaler = kwargs.get("grad_scaler")
    if scaler is not None:
        stage = scaler._per_optimizer_states[id(opt)]["stage"]
        if getattr(stage, "name", "") == "UNSCALED":
            return 1.0
        return float(scaler._get_scale_async())
    if hasattr(opt, "grad_scale"):
        scale = getattr(opt, "grad_scale")
        return 1.0 if scale is None else float(scale)
    return None


def _digest(items):
    """A 64-bit digest (signed, for an int64 collective) of (name, array) pairs: their names,
    shapes, dtypes and bytes. Equal digests on two ranks: equal bits (up to a 2**-64 chance)."""
    h = hashlib.blake2b(digest_size=8)
    for name, a in items:
        h.update(("%s|%s|%s|" % (name, a.dtype.str, a.shape)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return int.from_bytes(h.digest(), "little", signed=True)


def _ordered_mean(per_rank, precision):
    """grad_reduce="ordered"'s gradient from the K ranks' gradients of one parameter (float32, or
    bf16/fp16 encodings as uint16): the core's own rank reduction (math/rank_reduction.h: widened,
    added in rank order in fp32, divided by K, stored rounded to nearest even)."""
    shape = per_rank[0].shape
    flat = [np.ascontiguousarray(a).reshape(-1) for a in per_rank]
    return _core._ordered_rank_mean(flat, precision).reshape(shape)


class _Group:
    """The optimizer's torch.distributed process group, as the Recorder uses it (module doc,
    "Under a process group"). Every rank constructs the Recorder; rank 0 of the group writes."""

    def __init__(self, opt, groups):
        import torch.distributed as dist
        from . import _torch_dist
        self.comm = _torch_dist
        self.group = opt._process_group
        self.mode = getattr(opt, "_grad_reduce", "replicated")
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        if self.mode == "fast":
            raise ValueError("Recorder: grad_reduce='fast' sums the ranks' gradients with torch.distributed's "
                             "all_reduce, in an order the backend chooses, so no replay case can reproduce the "
                             "step bit for bit; record with grad_reduce='ordered' (the rank-order mean is recorded "
                             "exactly) or 'replicated' (nothing written)")
        for g in groups:
            binding = getattr(g.task, "_b", None)
            if binding is None or binding.shared.sharded is None or not binding.shared.sliced:
                raise TypeError("Recorder: a process_group optimizer whose groups are not renaissance.torch's "
                                "sharded Tasks (nothing written)")

    def agree(self, words):
        """Every rank's words (the same number on every rank), in rank order: a collective."""
        return self.comm.all_gather_words(self.group, words)

    def gather(self, arrays):
        """Rank 0: every rank's arrays (the same shapes and dtypes on every rank), per rank in
        rank order; the other ranks: None. One collective of the arrays' bytes."""
        import torch
        if not arrays:
            return [[] for _ in range(self.size)] if self.rank == 0 else None
        flat = np.concatenate([np.ascontiguousarray(a).view(np.uint8).ravel() for a in arrays])
        blocks = self.comm.gather_bytes(self.group, torch.from_numpy(flat))
        if blocks is None:
            return None
        out = []
        for block in blocks:
            data, at, mine = block.numpy(), 0, []
            for a in arrays:
                mine.append(data[at:at + a.nbytes].view(a.dtype).reshape(a.shape))
                at += a.nbytes
            out.append(mine)
        return out


def _state(task, family, name):
    """A host copy of one parameter's M or V: under a process group gathered from the ranks that
    hold its slices (ShardedStep::read_state, a collective), else the task's own."""
    binding = getattr(task, "_b", None)
    if binding is not None and binding.shared.sliced:
        return binding.shared.sharded.read_state(family, binding.ids[int(name)])
    return _read(task, family, name)


class Recorder:
    """Records ``steps`` optimizer steps of ``opt`` into ``case_dir`` (see the module doc).

    ``case_dir`` must not exist or be empty unless ``overwrite=True``; the case is written
    atomically (a temporary folder next to it, renamed into place), so a crash or an exception
    leaves no half-written case. Leaving a ``with`` block early writes the steps recorded so far;
    leaving it with an exception writes nothing. ``fingerprint`` holds the recorded value after
    finishing."""

    def __init__(self, opt, case_dir, steps, overwrite=False, name=None):
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"Recorder: steps must be a positive integer, got {steps!r}")
        active = getattr(opt, "_renaissance_recorder", None)
        if active is not None and not active.finished:
            # Two hooks on one step would unhook each other out of order; one recording at a time.
            raise ValueError(f"Recorder: this optimizer is already recording into {active.case_dir} (finish that "
                             "Recorder first)")
        if hasattr(opt, "_follow_params"):  # renaissance.torch: the bindings as param_groups has them now
            opt._follow_params()
        groups = getattr(opt, "_renaissance_groups", None) or getattr(opt, "_bindings", None)
        if not groups:
            raise TypeError("Recorder: the optimizer has no _renaissance_groups (a renaissance.torch optimizer is needed)")
        if not getattr(opt, "_master_weights", True) and any(getattr(b, "C", None) is not None for b in groups):
            # A replay case steps fp32 masters (docs/replay-format.md); a step that first resets
            # them from the bf16/fp16 parameters is not one it can express.
            raise ValueError("Recorder: an optimizer with master_weights=False and bf16/fp16 parameters cannot be "
                             "recorded: a replay case keeps fp32 master weights across steps")
        self.case_dir = os.path.abspath(os.fspath(case_dir))
        # Under a process group (renaissance.torch's process_group=): every rank records, rank 0
        # of the group alone checks case_dir and writes (the module doc).
        self._dist = _Group(opt, groups) if getattr(opt, "_process_group", None) is not None else None
        self._writes = self._dist is None or self._dist.rank == 0
        target_error = None
        try:
            if self._writes:
                self._check_target(overwrite)
        except OSError as e:
            if self._dist is None:
                raise
            target_error = e  # raised below on every rank, once the ranks have compared notes
        self.steps = steps
        self.overwrite = overwrite
        self.name = name if name is not None else os.path.basename(self.case_dir)
        self.fingerprint = None
        self.finished = False
        self._opt = opt
        self._groups = list(groups)
        # The replay runs the groups of one structure (kind, weight-decay mode, max_grad_norm, step
        # count) in one Task, as renaissance.torch does, so max_grad_norm clips over the groups it
        # clipped over here (docs/replay-format.md, "Running"). Only clipping groups of one
        # structure that stepped in different Tasks (other devices, separate Tasks) would clip
        # differently in the replay: refused.
        core_of = {}
        # The groups the replay puts in one Task (its key: kind, weight-decay mode, clipping, step
        # count), per key the core Tasks they come from: a step that leaves one of those Tasks
        # without any gradient (not stepped) and not another is refused in _step (the replay
        # would step them as one).
        self._replay_task = []
        for gi, g in enumerate(self._groups):
            config = _config(g.task)
            key = ((config["kind"], config["weight_decay_mode"]) + tuple(config[n] for n in _TASK_WIDE)
                   + (int(g.task.step_count),))
            self._replay_task.append(key)
            if config["max_grad_norm"] > 0:
                core = _core_task(g.task)
                other = core_of.setdefault(key, (gi, core))
                if other[1] is not core:
                    raise ValueError(f"Recorder: groups {other[0]} and {gi} clip with the same structure in different "
                                     "Tasks; a replay runs them in one Task and clips over both (record them separately)")
        precisions = {_precision(g.task) for g in self._groups}
        if len(precisions) > 1:
            raise ValueError("Recorder: the groups differ in precision, rounding or seed %s; a replay case has one "
                             "(record them separately)" % sorted(precisions))
        self._precision = precisions.pop()
        self._names = [list(getattr(g, "names", None) or [n for n, _, _ in g.task.params]) for g in self._groups]
        self._grads = []    # per step: {case name: array}
        self._no_grad = []  # per step: the case names of the parameters whose .grad was None
        self._lrs = []      # per step: per group lr
        self._scales = []   # per step
        self._configs = None
        self._params, self._init, self._initial_steps = [], [], []
        # Per group: each parameter's own count where its Task has the per-tensor mask, else None.
        self._initial_tensor_steps = []
        _sync(self._groups)
        if self._dist is not None:
            self._agree_at_start(target_error)
        for gi, g in enumerate(self._groups):
            task = g.task
            if _config(task).get("amsgrad") and int(task.step_count) > 0:
                # A case holds M and V (m/, v/) but not amsgrad's running max: from the first
                # step on a replay would start it at zero.
                raise ValueError("Recorder: group %d uses amsgrad and has stepped (%d steps): a case does not hold "
                                 "its max_exp_avg_sq; start the recording before the first step" %
                                 (gi, int(task.step_count)))
            families = _families(task)
            params = []
            for name_, shape, role in task.params:
                case_name = f"g{gi}.{name_}"
                params.append({"name": case_name, "shape": list(shape), "role": role})
                init = [(case_name, _read(task, "W", name_))]
                for f in families:  # the state, as the core holds it (gathered under a process group)
                    init.append((f"{f.lower()}/{case_name}", _state(task, f, name_)))
                if self._writes:  # the other ranks of a process group only take part in the gather
                    self._init.extend(init)
            self._params.append(params)
            self._initial_steps.append(int(task.step_count))
            self._initial_tensor_steps.append(_tensor_steps(task))
        # Hook opt.step: an instance attribute over the class's method, removed when finished.
        self._had_own_step = "step" in vars(opt)
        self._saved_step = vars(opt).get("step")
        self._inner_step = opt.step
        opt.step = self._step
        opt._renaissance_recorder = self
        # Each group's fingerprint (weights, state, step count) as the last step left it: an
        # edit between steps (a clamp_, p.data = ..., a state write) is not in the case, whose
        # replay would then miss the recorded fingerprint, so the next step refuses it.
        self._after = self._fingerprints()

    def _agree_at_start(self, target_error):
        """Under a process group, before the first collective read: every rank passed the same
        `steps`, rank 0 may write case_dir, and every rank starts from rank 0's parameters (the
        case holds one set; the sharded step assumes it). Any failure: the same error on every rank."""
        params = []
        for gi, g in enumerate(self._groups):
            for name_, _, _ in g.task.params:
                params.append((f"w{gi}.{name_}", _read(g.task, "W", name_)))
                if self._precision[0] != "fp32":
                    params.append((f"c{gi}.{name_}", _read_encoded(g.task, "C", name_)))
        seen = self._dist.agree([self.steps, target_error is None, _digest(params)])
        steps = [w[0] for w in seen]
        if len(set(steps)) > 1:
            raise ValueError(f"Recorder: the ranks of the process group pass different steps {steps}; every rank "
                             "records the same steps (nothing written)")
        if not seen[0][1]:
            if target_error is not None:
                raise target_error
            raise FileExistsError("Recorder: the process group's rank 0 refused case_dir (its error says why); "
                                  "nothing written")
        differ = [r for r, w in enumerate(seen) if w[2] != seen[0][2]]
        if differ:
            raise ValueError(f"Recorder: the parameters of rank(s) {differ} differ from rank 0's at the start of the "
                             "recording; every rank of a process group starts from the same parameters (as with "
                             "DDP), and a case holds one set (nothing written)")

    def _agree_on_step(self, grads, no_grad):
        """Under a process group, before the step: every rank leaves out the same parameters and,
        with grad_reduce="replicated", holds the same gradients (else rank 0's gradients are not
        what the step used); with "ordered", rank 0 gets every rank's gradients and records the
        step's real gradient, their rank-order mean. Returns what rank 0 records ({} elsewhere)."""
        t = len(self._grads)
        replicated = self._dist.mode == "replicated"
        items = list(grads.items())  # in group order, the same on every rank
        seen = self._dist.agree([_digest((n, np.zeros(0)) for n in no_grad), _digest(items) if replicated else 0])
        differ = [r for r, w in enumerate(seen) if w[0] != seen[0][0]]
        if differ:
            self._refuse(f"at step {t} rank(s) {differ} leave out (None gradient) other parameters than rank 0; "
                         "under a process_group every rank must leave out the same parameters")
        differ = [r for r, w in enumerate(seen) if w[1] != seen[0][1]]
        if differ:
            self._refuse(f"at step {t} the gradients of rank(s) {differ} differ from rank 0's; grad_reduce="
                         "'replicated' steps with every rank's own gradient as the full reduced one, so every rank "
                         "must hold the same (all-reduce them first, or use grad_reduce='ordered')")
        if replicated:
            return grads if self._writes else {}
        per_rank = self._dist.gather([a for _, a in items])
        if per_rank is None:
            return {}
        precision = self._precision[0]
        return {n: _ordered_mean([arrays[i] for arrays in per_rank], precision) for i, (n, _) in enumerate(items)}

    def _fingerprints(self):
        return [g.task.fingerprint() for g in self._groups]

    def _check_target(self, overwrite):
        # At construction, not after the steps: the folder the case is renamed into must exist
        # and take a new folder, and case_dir must not be a link (the atomic rename replaces it).
        parent = os.path.dirname(self.case_dir)
        if not os.path.isdir(parent):
            raise FileNotFoundError(f"Recorder: the parent folder {parent} of {self.case_dir} does not exist")
        if os.path.islink(self.case_dir):
            raise FileExistsError(f"Recorder: {self.case_dir} is a symbolic link; give the folder itself")
        probe = tempfile.mkdtemp(prefix="." + os.path.basename(self.case_dir) + ".probe-", dir=parent)
        os.rmdir(probe)
        if os.path.lexists(self.case_dir):
            if not os.path.isdir(self.case_dir):
                raise FileExistsError(f"Recorder: {self.case_dir} exists and is not a folder")
            if os.listdir(self.case_dir) and not overwrite:
                raise FileExistsError(f"Recorder: {self.case_dir} is not empty (overwrite=True replaces it)")

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.finished:
            return False
        if exc_type is not None:
            self._unhook()
            self.finished = True
            return False
        self.finish()
        return False

    def _refuse(self, message):
        self._unhook()
        self.finished = True
        raise ValueError(f"Recorder: {message} (recording stopped, nothing written)")

    def _step(self, *args, **kwargs):
        if hasattr(self._opt, "_follow_params"):
            self._opt._follow_params()  # a p.data = ... is copied in now, so the check below sees it
        live = getattr(self._opt, "_bindings", None)
        if live is not None and self._groups and any(all(g is not b for b in live) for g in self._groups):
            self._refuse(f"a param group was removed from param_groups at step {len(self._grads)}")
        now = self._fingerprints()
        changed = [gi for gi, (a, b) in enumerate(zip(self._after, now)) if a != b]
        if changed:
            self._refuse(f"the weights or state of group(s) {changed} changed between recorded steps (before step "
                         f"{len(self._grads)}: an in-place edit such as clamp_, p.data = ..., a state write or a "
                         "load outside step()); a replay case cannot hold such an edit")
        grads, no_grad = {}, []
        has_grad = {}  # per core Task: whether any of its parameters has a gradient (else not stepped)
        for gi, g in enumerate(self._groups):
            core = id(_core_task(g.task))
            has_grad.setdefault(core, False)
            for name_, p in zip(self._names[gi], g.params):
                if p.grad is None:  # renaissance.torch masks it (as torch, whatever requires_grad says)
                    if self._initial_tensor_steps[gi] is None:
                        self._refuse(f"parameter {name_} of group {gi} has no gradient at step {len(self._grads)}, and "
                                     "its Task runs without the per-tensor mask (a replay case cannot describe "
                                     "how such a Task stepped)")
                    no_grad.append(f"g{gi}.{name_}")
                    continue
                has_grad[core] = True
                grads[f"g{gi}.{name_}"] = _to_numpy(p.grad)
        if self._dist is not None:  # before any refusal below: the ranks refuse alike or not at all
            grads = self._agree_on_step(grads, no_grad)
        if no_grad:
            stepped = {}  # replay Task key -> whether its core Tasks step this time
            for gi, g in enumerate(self._groups):
                was = stepped.setdefault(self._replay_task[gi], has_grad[id(_core_task(g.task))])
                if was != has_grad[id(_core_task(g.task))]:
                    self._refuse(f"at step {len(self._grads)} group {gi}'s Task has no gradient at all (not stepped) "
                                 "and another Task of the same structure does, or the other way round; a replay runs "
                                 "them as one Task")
        scale = _torch_loss_scale(self._opt, kwargs)
        result = self._inner_step(*args, **kwargs)
        if getattr(self._opt, "_amp_skipped", False):
            # The GradScaler protocol skipped it before the core ran (found_inf, a scale whose
            # reciprocal is not finite): nothing changed, so the case leaves the step out.
            return result
        _sync(self._groups)
        # What the core used for this step: each task's lr, loss scale and configuration.
        tasks = [g.task for g in self._groups]
        configs = [_config(t) for t in tasks]
        if self._configs is None:
            self._configs = configs
        for gi, (was, now) in enumerate(zip(self._configs, configs)):
            changed = [k for k in _FIXED if was[k] != now[k]]
            if changed:
                self._unhook()
                self.finished = True
                raise ValueError(f"Recorder: group {gi} changed {', '.join(changed)} during the recording; a replay "
                                 "case keeps one optimizer per group (only lr varies per step); nothing written")
        if scale is None:
            task_scales = {float(t.loss_scale) for t in tasks}
            if len(task_scales) != 1:
                self._unhook()
                self.finished = True
                raise ValueError(f"Recorder: the groups stepped with different loss scales {sorted(task_scales)}")
            scale = task_scales.pop()
        self._after = self._fingerprints()
        self._grads.append(grads)
        self._no_grad.append(no_grad)
        self._lrs.append([float(t.lr) for t in tasks])
        self._scales.append(scale)
        if len(self._grads) == self.steps:
            self.finish()
        return result

    def _unhook(self):
        if self._had_own_step:
            self._opt.step = self._saved_step
        elif "step" in vars(self._opt):
            del self._opt.step

    def finish(self):
        """Stops recording, writes the case and returns the recorded fingerprint."""
        if self.finished:
            return self.fingerprint
        self._unhook()
        self.finished = True
        fingerprints = self._fingerprints()
        if fingerprints != self._after:  # an edit after the last recorded step (leaving a with block early)
            raise ValueError("Recorder: the weights or state changed after the last recorded step (an edit outside "
                             "step()); a replay case cannot hold such an edit (recording stopped, nothing written)")
        self.fingerprint = _core.combine_fingerprints(fingerprints)
        steps = len(self._grads)
        case = {
            "format": "renaissance-replay/2",
            "name": self.name,
            "steps": steps,
            "loss_scale_per_step": self._scales,
            "expected_fingerprint": self.fingerprint,
            "groups": [],
        }
        precision, rounding, seed = self._precision
        expected = []
        if precision != "fp32":
            case.update(precision=precision, rounding=rounding, seed=seed)
            # The final state (an expected file names every parameter) and the final model copy,
            # which the replay compares bit for bit.
            for gi, g in enumerate(self._groups):
                families = _families(g.task)
                for name_ in self._names[gi]:
                    case_name = f"g{gi}.{name_}"
                    expected.append((case_name, _read(g.task, "W", name_)))
                    expected.extend((f"{f.lower()}/{case_name}", _state(g.task, f, name_)) for f in families)
                    expected.append((f"c/{case_name}", _read_encoded(g.task, "C", name_)))
        # Per-tensor counts only where the run had None gradients or began with counts that differ
        # from the groups' own: every other case stays as it was (no mask in the replay).
        masked_run = any(self._no_grad) or any(
            steps is not None and any(s != self._initial_steps[gi] for s in steps)
            for gi, steps in enumerate(self._initial_tensor_steps))
        if masked_run:
            case["no_grad_per_step"] = self._no_grad
        for gi, params in enumerate(self._params):
            config = dict((self._configs or [_config(g.task) for g in self._groups])[gi])
            if config["weight_decay_mode"] == "decoupled":
                del config["weight_decay_mode"]  # the default, and the only mode most kinds accept
            for name, default in _OPTIONAL.items():
                if name in config and config[name] == default:
                    del config[name]
            group = {"optimizer": config, "params": params, "lr_per_step": [lrs[gi] for lrs in self._lrs]}
            if self._initial_steps[gi]:
                group["initial_step"] = self._initial_steps[gi]
            initial = self._initial_tensor_steps[gi]
            if masked_run and initial is not None:
                if any(s != self._initial_steps[gi] for s in initial):
                    group["initial_tensor_steps"] = initial
                group["expected_tensor_steps"] = _tensor_steps(self._groups[gi].task)
            case["groups"].append(group)
        grads = [(f"step{t}/{n}", a) for t, step in enumerate(self._grads) for n, a in step.items()]
        if self._dist is None:
            self._write(case, grads, expected)
            return self.fingerprint
        # Rank 0 writes; every rank learns whether it did (a failure raises on every rank).
        error = None
        if self._writes:
            try:
                self._write(case, grads, expected)
            except Exception as e:  # re-raised below, after the other ranks heard of it
                error = e
        written = self._dist.agree([error is None])[0][0]
        if error is not None:
            raise error
        if not written:
            raise RuntimeError("Recorder: the process group's rank 0 failed to write the case (its error says why)")
        return self.fingerprint

    def _write(self, case, grads, expected=()):
        self._check_target(self.overwrite)  # again: the folder may have filled meanwhile
        parent = os.path.dirname(self.case_dir)
        tmp = tempfile.mkdtemp(prefix="." + os.path.basename(self.case_dir) + ".tmp-", dir=parent)
        try:
            meta = {"format": "renaissance-replay/2", "writer": "renaissance.torch.Recorder"}
            _core._write_safetensors(os.path.join(tmp, "init.safetensors"), self._init, meta)
            # Encoded tensors (unsigned integers: uint16, uint8 for a 1-byte encoding) are in the
            # case's model dtype.
            half = _ST_DTYPE.get(case.get("precision"), "F32")
            dtypes = {n: half for n, a in list(grads) + list(expected) if np.dtype(a.dtype).kind == "u"}
            _core._write_safetensors(os.path.join(tmp, "grads.safetensors"), grads, meta, dtypes)
            if expected:
                _core._write_safetensors(os.path.join(tmp, "expected.safetensors"), list(expected), meta, dtypes)
            with open(os.path.join(tmp, "case.json"), "w") as f:
                json.dump(case, f, indent=1)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o755)
            old = None
            if os.path.isdir(self.case_dir):
                if os.listdir(self.case_dir):
                    old = tempfile.mkdtemp(prefix="." + os.path.basename(self.case_dir) + ".old-", dir=parent)
                    os.rename(self.case_dir, os.path.join(old, "case"))
                else:
                    os.rmdir(self.case_dir)
            os.rename(tmp, self.case_dir)
            tmp = None
            if old is not None:
                shutil.rmtree(old)
            fd = os.open(parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
