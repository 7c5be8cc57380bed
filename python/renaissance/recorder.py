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

    with Recorder(opt, "case_dir", steps=5):       # or rec = Recorder(...); it finishes by itself
        for x, y in batches:
            loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad()

It wraps ``opt.step`` (restored when it finishes) and needs from the optimizer only its groups:
``opt._renaissance_groups`` (or ``opt._bindings``), per torch param group in order, objects with
``.task`` (a ``renaissance._core.Task``, or a GroupTask: one hyperparameter group of a shared Task), ``.params`` (the torch tensors) and ``.names`` (the
task's parameter names; when absent, the task's own names in order). Everything recorded is kept
in host memory until the case is written (steps x the model's size, float32).
"""
import json
import os
import shutil
import tempfile

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
    """uint16 encodings of a model copy ("C") or model-dtype gradient ("G")."""
    if isinstance(task, _core.Task):
        return task.get_model_copy(name) if family == "C" else task.get_grad_encoded(name)
    return task.read_encoded(family, name)


_ST_DTYPE = {"bf16": "BF16", "fp16": "F16"}

# Hyperparameters that must stay as they were for the whole recording: the case has one
# optimizer per group; only the learning rate is recorded per step.
_FIXED = ("kind", "weight_decay", "momentum", "beta1", "beta2", "eps", "trust_coefficient", "max_grad_norm",
          "weight_decay_mode")


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
    float32, or a bf16/fp16 gradient's uint16 encodings, bit for bit."""
    import torch
    t = t.detach().to("cpu").contiguous()
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).numpy().view("uint16").copy()
    a = t.numpy()
    if str(a.dtype) != "float32":
        raise ValueError(f"Recorder: a {a.dtype} gradient; the replay format holds float32, bf16 and fp16")
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
        groups = getattr(opt, "_renaissance_groups", None) or getattr(opt, "_bindings", None)
        if not groups:
            raise TypeError("Recorder: the optimizer has no _renaissance_groups (a renaissance.torch optimizer is needed)")
        self.case_dir = os.path.abspath(os.fspath(case_dir))
        self._check_target(overwrite)
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
            key = (config["kind"], config["weight_decay_mode"], config["max_grad_norm"], int(g.task.step_count))
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
        for gi, g in enumerate(self._groups):
            task = g.task
            families = _families(task)
            params = []
            for name_, shape, role in task.params:
                case_name = f"g{gi}.{name_}"
                params.append({"name": case_name, "shape": list(shape), "role": role})
                self._init.append((case_name, _read(task, "W", name_)))
                for f in families:  # the state, as the core holds it
                    self._init.append((f"{f.lower()}/{case_name}", _read(task, f, name_)))
            self._params.append(params)
            self._initial_steps.append(int(task.step_count))
            self._initial_tensor_steps.append(_tensor_steps(task))
        # Hook opt.step: an instance attribute over the class's method, removed when finished.
        self._had_own_step = "step" in vars(opt)
        self._saved_step = vars(opt).get("step")
        self._inner_step = opt.step
        opt.step = self._step

    def _check_target(self, overwrite):
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
        grads, no_grad = {}, []
        has_grad = {}  # per core Task: whether any of its parameters has a gradient (else not stepped)
        for gi, g in enumerate(self._groups):
            core = id(_core_task(g.task))
            has_grad.setdefault(core, False)
            for name_, p in zip(self._names[gi], g.params):
                if p.grad is None:
                    if self._initial_tensor_steps[gi] is None:
                        self._refuse(f"parameter {name_} of group {gi} has no gradient at step {len(self._grads)}, and "
                                     "its Task runs without the per-tensor mask (a replay case cannot describe "
                                     "how such a Task stepped)")
                    no_grad.append(f"g{gi}.{name_}")
                    continue
                has_grad[core] = True
                grads[f"g{gi}.{name_}"] = _to_numpy(p.grad)
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
        fingerprints = [g.task.fingerprint() for g in self._groups]
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
                    expected.extend((f"{f.lower()}/{case_name}", _read(g.task, f, name_)) for f in families)
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
        self._write(case, grads, expected)
        return self.fingerprint

    def _write(self, case, grads, expected=()):
        self._check_target(self.overwrite)  # again: the folder may have filled meanwhile
        parent = os.path.dirname(self.case_dir)
        tmp = tempfile.mkdtemp(prefix="." + os.path.basename(self.case_dir) + ".tmp-", dir=parent)
        try:
            meta = {"format": "renaissance-replay/2", "writer": "renaissance.torch.Recorder"}
            _core._write_safetensors(os.path.join(tmp, "init.safetensors"), self._init, meta)
            # Encoded (uint16) tensors are in the case's model dtype.
            half = _ST_DTYPE.get(case.get("precision"), "F32")
            dtypes = {n: half for n, a in list(grads) + list(expected) if str(a.dtype) == "uint16"}
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
