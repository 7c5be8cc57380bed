"""renaissance.torch: the fused optimizers as torch.optim.Optimizer subclasses (docs/python.md).

    import renaissance.torch as rt
    opt = rt.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)

The param groups that share a compiled step (kind, weight-decay mode, clipping) share one core
Task, each group a hyperparameter group of it (its own scalar block): step() is one core step
whatever the number of groups (one per structural class of groups). Parameters and gradients live in the Task's arena (zero-copy views), state_dict()
uses torch's names and format, fingerprint() is the CLI's XXH3. Imported only on request:
`import renaissance` does not import torch.
"""
import copy
import hashlib
import math
import numbers
import operator
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from itertools import chain

import numpy as np
import torch
import torch.distributed as dist
import torch.optim.optimizer as _torch_optimizer
from torch.optim.optimizer import Optimizer
from torch.utils.hooks import RemovableHandle

from . import _checkpoint_set
from . import _core
from . import _torch_dist
from ._torch_group import TASK_WIDE, GroupBinding, SharedTask, structure_key, tensor_interval

__all__ = ["SGD", "Adam", "AdamW", "LARS", "Lion", "LAMB", "Muon", "MuonWithAuxAdam", "Recorder",
           "register_optimizer_step_pre_hook", "register_optimizer_step_post_hook"]

_KINDS = {k["name"]: k for k in _core.kinds()}

# torch.optim's flags: the default of each (a group without the key takes it). amsgrad (Adam,
# AdamW) is a task-wide setting of the core (groups that differ get Tasks of their own; an edit
# after construction is refused); maximize is a per-group setting of the core (every kind,
# the gradient negated before everything else of the update); foreach, fused and capturable choose among
# torch's implementations, and the library has one, which is fused and captured (docs/python.md):
# every value torch takes is accepted and kept; differentiable=True is refused as torch refuses it
# for its fused step.
_TORCH_FLAGS = {"amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                "differentiable": False, "fused": None}

# Parameter dtypes the adapter takes, and the core precision of each (bf16/fp16: fp32 masters in
# the arena, the parameter is a view of the model copy; docs/python.md, "bf16 and fp16 parameters"):
# the precision table's rows (_core.precisions()) whose torch dtype the installed torch has, and
# complex64, whose arena holds the float32 real view (_torch_group.py).
_DEVICES = ("cpu", "cuda")  # where the library's step runs
_PRECISION = {getattr(torch, row["torch_dtype"]): row["name"] for row in _core.precisions()
              if isinstance(getattr(torch, row["torch_dtype"], None), torch.dtype)}
_PRECISION[torch.complex64] = "fp32"
# The dtypes above as a sentence's list, for the message that refuses another ("float32, bfloat16,
# float16 and complex64").
_PRECISION_TEXT = " and ".join([", ".join(str(d).replace("torch.", "") for d in list(_PRECISION)[:-1]),
                                str(list(_PRECISION)[-1]).replace("torch.", "")])


def _defaults_of(kind):
    return _KINDS[kind]["defaults"]


# The step hooks common to all optimizers: torch's own tables where torch has them (2.0+), so that
# torch.optim.optimizer.register_optimizer_step_pre_hook reaches these classes too; else the
# module's, filled by the functions below.
# Core hyperparameter names -> how a param group spells them (_Base._agreement_lines). Muon's
# Newton-Schulz keys are torch.optim.Muon's; an aux AdamW group (MuonWithAuxAdam) runs with the
# core's aux_lr and aux_weight_decay, which are its group's lr and weight_decay.
_AGREE_NAMES = {"beta1": "['betas'][0]", "beta2": "['betas'][1]", "ns_eps": "['eps']",
                "ns_a": "['ns_coefficients'][0]", "ns_b": "['ns_coefficients'][1]", "ns_c": "['ns_coefficients'][2]",
                "adjust_lr": "['adjust_lr_fn']", "aux_lr": "['lr']", "aux_weight_decay": "['weight_decay']"}
_GLOBAL_PRE_HOOKS = getattr(_torch_optimizer, "_global_optimizer_pre_hooks", None)
_GLOBAL_POST_HOOKS = getattr(_torch_optimizer, "_global_optimizer_post_hooks", None)
if _GLOBAL_PRE_HOOKS is None or _GLOBAL_POST_HOOKS is None:
    _GLOBAL_PRE_HOOKS, _GLOBAL_POST_HOOKS = OrderedDict(), OrderedDict()


def register_optimizer_step_pre_hook(hook):
    """torch.optim.optimizer.register_optimizer_step_pre_hook (torch 2.0), also on older torch:
    hook(optimizer, args, kwargs) -> None or (new_args, new_kwargs), before every step() of every
    optimizer (torch's too, where torch has the function). Returns a RemovableHandle."""
    handle = RemovableHandle(_GLOBAL_PRE_HOOKS)
    _GLOBAL_PRE_HOOKS[handle.id] = hook
    return handle


def register_optimizer_step_post_hook(hook):
    """torch.optim.optimizer.register_optimizer_step_post_hook: hook(optimizer, args, kwargs)
    after every step()."""
    handle = RemovableHandle(_GLOBAL_POST_HOOKS)
    _GLOBAL_POST_HOOKS[handle.id] = hook
    return handle


_HOOK_TABLES = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks", "_optimizer_state_dict_pre_hooks",
                "_optimizer_state_dict_post_hooks", "_optimizer_load_state_dict_pre_hooks",
                "_optimizer_load_state_dict_post_hooks")


class _Base(Optimizer):
    """What every renaissance.torch optimizer shares; subclasses say how a group maps to a kind."""

    # The module-level function that step() runs, looked up by name at every step (see
    # _multi_tensor_step below); each class names torch's default implementation of its kind.
    _implementation = "_multi_tensor_step"

    _step_supports_amp_scaling = True
    _flags = ()  # the torch flags this class's torch counterpart has (kept in param_groups)
    # Every torch state key this class's groups may keep (core family -> key, "step": "step";
    # _torch_state), the keys load_state_dict accepts; each group's own: _state_names_for.
    _state_names = {}
    # The group keys that tell this algorithm's state dicts from another class's (torch's and
    # this library's): load_state_dict refuses a group that lacks a required key or holds a key
    # of another class's groups (any other key, such as a scheduler's initial_lr, passes).
    _required_keys = ()
    _group_keys = ()  # every key this class's (or its torch counterpart's) groups may hold

    def __init__(self, params, defaults, threads=0, master_weights=True, stochastic_rounding=False, seed=0,
                 process_group=None, grad_reduce="replicated"):
        # A sharded data-parallel step over a torch.distributed group (_torch_dist.py).
        _torch_dist.check_group(process_group, grad_reduce)
        self._process_group = process_group
        self._grad_reduce = grad_reduce
        if isinstance(threads, bool) or not isinstance(threads, int) or not 0 <= threads < 2 ** 31:
            raise ValueError("threads=%r: must be an int in [0, 2**31) (0: all cores)" % (threads,))
        for name, flag in (("master_weights", master_weights), ("stochastic_rounding", stochastic_rounding)):
            if not isinstance(flag, bool):
                raise ValueError("%s=%r: expected a bool" % (name, flag))
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 64:
            raise ValueError("seed=%r: expected an int in [0, 2**64)" % (seed,))
        for flag in self._flags:
            _check_flag(flag, defaults[flag], type(self).__name__)
        if defaults.get("fused") and defaults.get("foreach"):
            raise RuntimeError("`fused` and `foreach` cannot be `True` together.")  # torch's rule and text
        self._threads = threads
        self._master_weights = master_weights
        self._rounding = "stochastic" if stochastic_rounding else "nearest"
        self._seed = seed
        self._bindings = []
        # step() runs under it: threads stepping one optimizer take turns (a core step over the
        # arena, the masks and the bindings is not safe to run twice at once).
        self._step_lock = threading.Lock()
        for table in _HOOK_TABLES:  # torch 2.x's constructor makes them again (empty), 1.x's not at all
            setattr(self, table, OrderedDict())
        # Parameters on a device without this step (meta: not materialized yet) are taken as
        # torch takes them, and bound at the first call that finds every parameter on cpu or
        # cuda (_bind_pending); until then a step over one with a gradient is torch's error.
        # Not under a process group: every rank binds at construction (the handshake).
        self._pending = False
        defer = process_group is None
        groups = _as_groups(params)
        _check_names(groups, [])
        _validate_new(groups, [], defer=defer)
        if stochastic_rounding and all(_PRECISION[p.dtype] == "fp32" for g in groups for p in g["params"]):
            raise ValueError("stochastic_rounding=True rounds the bf16/fp16 copy of bf16/fp16 parameters; these "
                             "parameters are all float32 (no copy to round)")
        # torch's constructor adds the groups one by one: bind them all at once afterwards, so
        # that the groups of one structural class share one Task.
        self._deferred = True
        try:
            super().__init__(groups, defaults)
            if defer and any(p.device.type not in _DEVICES for g in self.param_groups for p in g["params"]):
                self._pending = True
                for group in self.param_groups:  # validated now, as torch's constructor does
                    for flag in self._flags:
                        _check_flag(flag, group.get(flag, _TORCH_FLAGS[flag]), type(self).__name__)
                    self._core_config(group)
            else:
                self._bind(list(range(len(self.param_groups))))
        finally:
            self._deferred = False

    # ---- groups -----------------------------------------------------------------------------
    def add_param_group(self, param_group):
        if not isinstance(param_group, dict):
            raise TypeError("param_group must be a dict, but got %s" % type(param_group))
        if getattr(self, "_pending", False):
            existing = [p for g in self.param_groups for p in g["params"]]
        else:
            existing = [p for b in getattr(self, "_bindings", []) for p in b.params]
        group = _split_names(dict(param_group))
        _check_names([group], self.param_groups)
        _validate_new([group], existing, defer=self._process_group is None)
        n_before = len(self.param_groups)
        super().add_param_group(group)
        if getattr(self, "_deferred", False) or self._pending:
            if not self._deferred:  # validated as the constructor validates a group
                for flag in self._flags:
                    _check_flag(flag, group.get(flag, _TORCH_FLAGS[flag]), type(self).__name__)
                try:
                    self._core_config(self.param_groups[-1])
                except Exception:
                    del self.param_groups[n_before:]
                    raise
            return
        # A group added after construction gets a Task of its own (the others are compiled).
        self._bind([n_before])

    def _bind(self, indices):
        """Builds the Tasks of param_groups[indices]: one per structural class, in order."""
        n_before = min(indices)
        try:
            classes = {}  # structure key -> [(group index, roles, hyper)]
            for i in indices:
                group = self.param_groups[i]
                for flag in self._flags:
                    _check_flag(flag, group.get(flag, _TORCH_FLAGS[flag]), type(self).__name__)
                kind, hyper = self._core_config(group)
                precision = _PRECISION[group["params"][0].dtype]
                key = structure_key(kind, hyper, group["params"][0].device) + (tuple(sorted(self._task_state_names(group).items())),)
                key += (precision,)
                if precision != "fp32" and self._rounding == "stochastic":
                    # A Task of its own per group: the rounding key's parameter index is then the
                    # index within the group, as a replay case (docs/replay-format.md) runs it.
                    key += (i,)
                classes.setdefault(key, []).append((i, self._roles(group), hyper))
            made = {}
            for key, members in classes.items():
                # structure_key is (kind, decay mode, the task-wide rows..., device), then the
                # state names and the precision.
                at = 2 + len(TASK_WIDE)
                kind, device, precision = key[0], key[at], key[at + 2]
                rounding = self._rounding if precision != "fp32" else "nearest"
                shared = SharedTask([(self.param_groups[i]["params"], roles, hyper) for i, roles, hyper in members],
                                    kind, device, self._threads, self._task_state_names(self.param_groups[members[0][0]]),
                                    precision=precision, rounding=rounding, seed=self._seed,
                                    sharded=self._process_group is not None, master_weights=self._master_weights,
                                    state_shard=None if self._process_group is None else
                                    (dist.get_rank(self._process_group), dist.get_world_size(self._process_group)))
                first = 0
                for h, (i, roles, hyper) in enumerate(members):
                    made[i] = GroupBinding(shared, h, first, self.param_groups[i]["params"], roles, hyper)
                    own = self._state_names_for(self.param_groups[i])
                    if own != self._task_state_names(self.param_groups[i]):
                        # The group's own torch state (MuonWithAuxAdam: a Muon group's
                        # momentum_buffer beside the aux AdamW's exp_avg, exp_avg_sq, step in
                        # one Task), with the fp32 masters where the Task keeps them.
                        made[i].state_names = dict(own, **{f: n for f, n in shared.state_names.items() if f == "W"})
                    first += len(self.param_groups[i]["params"])
        except Exception:
            del self.param_groups[n_before:]
            raise
        for i in indices:
            made[i].trust_ratio = self.param_groups[i].get("trust_ratio")  # what the roles were made from
        new_tasks = list({id(b.shared): b.shared for b in made.values()}.values())
        if self._process_group is not None:
            # Before adopt(): a failed handshake leaves the parameters as they were.
            try:
                _torch_dist.attach(new_tasks, self._process_group, self._grad_reduce, self._agreement_lines(
                    [self._core_config(g) for g in self.param_groups]))
            except Exception:
                del self.param_groups[n_before:]
                raise
            self.__dict__.setdefault("_sharded_tasks", []).extend(new_tasks)
        for shared in new_tasks:
            shared.adopt()
        for i in indices:
            made[i].seq = self._next_seq = getattr(self, "_next_seq", -1) + 1  # the order it was bound in
            made[i].group_params = self.param_groups[i]["params"]  # the list _binding_plan compares
        self._bindings.extend(made[i] for i in indices)
        self._refresh_state()

    def _bind_pending(self):
        """An optimizer built over parameters on a device without this step (meta) binds them once
        every one is on cpu or cuda (model.to_empty(device=...) keeping the parameter objects,
        e.g. torch.__future__.set_swap_module_params_on_conversion(True)): every construction check
        again, then the Tasks. -> whether the optimizer is bound."""
        if not self._pending:
            return True
        if any(p.device.type not in _DEVICES for g in self.param_groups for p in g["params"]):
            return False
        _validate_new(self.param_groups, [])
        saved = list(self.param_groups)
        try:
            self._bind(list(range(len(self.param_groups))))
        except Exception:
            self.param_groups[:] = saved  # _bind drops the groups it could not bind
            raise
        self._pending = False
        return True

    def _unbound_error(self, with_grad=False):
        """torch's error for its fused step over a parameter on a device it has no kernel for (the
        first such parameter; with_grad: the first that has a gradient, as torch checks only those),
        or None."""
        for g in self.param_groups:
            for p in g["params"]:
                if p.device.type not in _DEVICES and (p.grad is not None or not with_grad):
                    return _fused_device_error(p)
        return None

    def _shared(self):
        """The distinct Tasks, in the order their groups were bound (stable when param_groups is
        reordered: save()'s path.taskN and the step order stay the same)."""
        return list({id(b.shared): b.shared for b in sorted(self._bindings, key=lambda b: b.seq)}.values())

    # ---- the binding, checked at every step ---------------------------------------------------
    def _binding_plan(self, repeats=False):
        """What param_groups and the parameters' .data say now, checked against the bindings
        before anything changes: -> (bindings in param_groups order, dropped bindings, moved
        parameters per Task, the groups the bindings are of). torch steps whatever param_groups
        holds, in any order, and whatever each p.data is: a reordered list keeps every group's
        hyperparameters, a removed group is no longer stepped, `p.data = tensor` of the same
        shape, dtype and device is copied in. Anything else (a group's parameters edited, a group
        not added with add_param_group, a .data of another shape, dtype or device) is a
        ValueError naming the parameter. repeats=True (reads such as state_dict()): a group that
        lists exactly the parameters of an earlier group (param_groups extended with itself) is
        passed over, as torch's state_dict packs it; a step refuses it (torch would step those
        parameters twice)."""
        groups, bound = self.param_groups, self._bindings
        if len(groups) == len(bound) and all(
                g["params"] is b.group_params and len(b.params) == len(g["params"])
                and all(map(operator.is_, g["params"], b.params)) for g, b in zip(groups, bound)):
            ordered = bound
        else:
            ordered, groups = self._match_groups(groups, repeats)
        kept = {id(b) for b in ordered}
        dropped = [b for b in bound if id(b) not in kept]
        moved = []
        for shared in {id(b.shared): b.shared for b in ordered}.values():
            ids = shared.moved()
            if ids:
                for j in ids:
                    self._check_moved(ordered, shared, j)
                moved.append((shared, ids))
        return ordered, dropped, moved, groups

    def _match_groups(self, groups, repeats=False):
        """param_groups -> (their bindings by parameter identity (a reordered or re-created group
        dict is found again), the groups matched), else a ValueError saying what changed.
        repeats: see _binding_plan."""
        owner = {id(p): (b, j) for b in self._bindings for j, p in enumerate(b.params)}
        ordered, matched, seen = [], [], {}
        for gi, g in enumerate(groups):
            ps = list(g["params"])
            hits = [owner.get(id(p)) for p in ps]
            if not ps or all(h is None for h in hits):
                raise ValueError("param group %d is not bound to this optimizer (a group appended to param_groups "
                                 "directly): add groups with add_param_group" % gi)
            b = next(h[0] for h in hits if h is not None)
            if id(b) in seen:
                if repeats and len(ps) == len(b.params) and all(map(operator.is_, ps, b.params)):
                    continue
                raise ValueError("param group %d lists the parameters of param group %d: a parameter is stepped "
                                 "once per step(); remove the repeated group" % (gi, seen[id(b)]))
            seen[id(b)] = gi
            for j in range(max(len(ps), len(b.params))):
                q = ps[j] if j < len(ps) else None
                if j >= len(b.params) or q is not b.params[j]:
                    shape = tuple((q if q is not None and j >= len(b.params) else b.params[j]).shape)
                    raise ValueError("param group %d, parameter %d (shape %s): the group's parameters changed after "
                                     "construction (%d listed, %d bound); a group's parameters are fixed, add "
                                     "others with add_param_group" % (gi, j, shape, len(ps), len(b.params)))
            ordered.append(b)
            matched.append(g)
        return ordered, matched

    @staticmethod
    def _check_moved(ordered, shared, j):
        p, view = shared.params[j], shared.weights[j]
        if p.data.shape != view.shape or p.data.dtype != view.dtype or p.data.device != view.device:
            where = next(("param group %d, parameter %d" % (gi, b.ids.index(j)))
                         for gi, b in enumerate(ordered) if b.shared is shared and j in b.ids)
            raise ValueError("%s (shape %s): p.data was replaced by a tensor of shape %s, %s on %s; the optimizer "
                             "was built for %s on %s (copy new values in place, or build a new optimizer)" %
                             (where, tuple(view.shape), tuple(p.data.shape), p.data.dtype, p.data.device,
                              view.dtype, view.device))

    def _apply_binding_plan(self, plan):
        ordered, dropped, moved, groups = plan
        for b in dropped:
            b.shared.dropped = b.shared.dropped | frozenset(b.ids)
            for p in b.params:
                self.state.pop(p, None)  # torch's state_dict packs the state of param_groups' parameters
        if ordered is not self._bindings:
            for b, g in zip(ordered, groups):
                b.group_params = g["params"]
            self._bindings = list(ordered)
        for shared, ids in moved:
            shared.follow_data(ids)

    def _follow_params(self, repeats=False):
        """Checks the binding, then follows it (see _binding_plan)."""
        if not self._bind_pending():
            raise self._unbound_error()
        self._apply_binding_plan(self._binding_plan(repeats))

    def _roles(self, group):
        return ["fc_weight"] * len(group["params"])

    def _state_names_for(self, group):
        """The group's torch state keys: its kind's (and amsgrad's), from the core's tables (SGD with
        momentum 0 runs kind sgd, which keeps no M)."""
        kind, hyper = self._core_config(group)
        if kind == "sgd":  # torch keeps no step for SGD; its state with momentum 0: _plain_sgd_state
            return {}
        return _torch_state(kind, hyper.get("amsgrad", False))

    def _task_state_names(self, group):
        """The state families the group's Task keeps views of (the groups that share a Task hold
        the same): the group's own state names unless a class keeps several per Task."""
        return self._state_names_for(group)

    def _core_config(self, group):  # -> (kind name, core hyperparameters)
        raise NotImplementedError

    # ---- step -------------------------------------------------------------------------------
    def zero_grad(self, set_to_none=True):
        """torch's semantics: set_to_none=True (the default, as in torch 2.x) sets every `.grad`
        to None, so the next backward hands over fresh gradients, which step() reads where they are
        through the Task's gradient table (no copy, no zeroing; `.grad` stays autograd's tensor);
        set_to_none=False zeroes G in place (one op per Task) and points every `.grad` that is not
        None at its zeroed view, into which backward then accumulates (a None one stays None, as
        in torch: the parameter is not stepped until backward reaches it). The first is the cheaper training step
        (autograd's accumulate is an add per parameter): see docs/python.md."""
        if not self._bind_pending():  # torch's zero_grad on the parameters themselves
            for g in self.param_groups:
                for p in g["params"]:
                    if p.grad is not None:
                        if set_to_none:
                            p.grad = None
                        else:
                            if p.grad.grad_fn is not None:
                                p.grad.detach_()
                            else:
                                p.grad.requires_grad_(False)
                            p.grad.zero_()
            return
        self._follow_params()
        for shared in self._shared():
            shared.zero_grad(set_to_none)

    # ---- hooks (torch 2.x's, whatever torch is installed) --------------------------------------
    def _patch_step_function(self):
        # torch 2.x wraps the class's step() to run the step hooks; step() below runs them itself
        # (on every torch version, in torch's order), so the wrapper would run them twice.
        self._zero_grad_profile_name = "Optimizer.zero_grad#%s.zero_grad" % type(self).__name__

    def register_step_pre_hook(self, hook):
        """hook(optimizer, args, kwargs) -> None or (new_args, new_kwargs), before each step()
        (after the global pre-hooks); args holds the optimizer first, as torch passes it."""
        return _register(self._optimizer_step_pre_hooks, hook, False)

    def register_step_post_hook(self, hook):
        """hook(optimizer, args, kwargs), after each step() (before the global post-hooks)."""
        return _register(self._optimizer_step_post_hooks, hook, False)

    def register_state_dict_pre_hook(self, hook, prepend=False):
        """hook(optimizer), first thing in state_dict()."""
        return _register(self._optimizer_state_dict_pre_hooks, hook, prepend)

    def register_state_dict_post_hook(self, hook, prepend=False):
        """hook(optimizer, state_dict) -> None or a state dict state_dict() returns instead."""
        return _register(self._optimizer_state_dict_post_hooks, hook, prepend)

    def register_load_state_dict_pre_hook(self, hook, prepend=False):
        """hook(optimizer, state_dict) -> None or the state dict to load instead; state_dict is a
        shallow copy of the one passed to load_state_dict()."""
        return _register(self._optimizer_load_state_dict_pre_hooks, hook, prepend)

    def register_load_state_dict_post_hook(self, hook, prepend=False):
        """hook(optimizer), after load_state_dict() has loaded everything: the state it sees
        (opt.state, the live arena views) and the param_groups are the loaded ones, and what it
        changes there stays."""
        return _register(self._optimizer_load_state_dict_post_hooks, hook, prepend)

    def step(self, *args, **kwargs):
        """step(closure=None): one core step per Task (one for all groups of a structural class).
        Under torch.cuda.amp.GradScaler the scale reaches the fused unscale on the device; a step
        with a non-finite gradient is skipped. torch's step hooks run around it: the global and
        then this optimizer's pre-hooks, the step, this optimizer's and then the global
        post-hooks. Holds the optimizer's lock (hooks and closure included): concurrent calls run
        one after the other."""
        args = (self,) + args
        with self._step_lock, torch.autograd.profiler.record_function("Optimizer.step#%s.step" % type(self).__name__):
            for pre_hook in chain(_GLOBAL_PRE_HOOKS.values(), self._optimizer_step_pre_hooks.values()):
                result = pre_hook(self, args, kwargs)
                if result is not None:
                    if isinstance(result, tuple) and len(result) == 2:
                        args, kwargs = result
                    else:
                        raise RuntimeError("%s must return None or a tuple of (new_args, new_kwargs), but got %s."
                                           % (pre_hook, result))
            out = globals()[self._implementation](*args, **kwargs)
            for post_hook in chain(self._optimizer_step_post_hooks.values(), _GLOBAL_POST_HOOKS.values()):
                post_hook(self, args, kwargs)
            return out

    @torch.no_grad()
    def _step(self, closure=None, **kwargs):
        grad_scaler = kwargs.pop("grad_scaler", None)  # torch 1.x passes itself
        if kwargs:
            raise TypeError("step() got unexpected keyword arguments: %s" % ", ".join(sorted(kwargs)))
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grad_scale = getattr(self, "grad_scale", None)  # torch 2.x sets grad_scale and found_inf
        found_inf = getattr(self, "found_inf", None)
        if grad_scaler is not None:
            grad_scale, found_inf = _scale_from_scaler(grad_scaler, self)
        if not self._bind_pending():
            # Some parameter is still on a device without this step (meta). torch's fused step
            # checks the parameters that have a gradient: its error for such a one; none with a
            # gradient anywhere: nothing to step, as in torch.
            error = self._unbound_error(with_grad=True)
            if error is not None:
                raise error
            if any(p.grad is not None for g in self.param_groups for p in g["params"]):
                raise ValueError("parameters on different devices (%s): one optimizer takes one device" % ", ".join(
                    sorted({str(p.device) for g in self.param_groups for p in g["params"]})))
            return loss
        if self._process_group is None:
            self._prepare_step()
        else:
            # Under a process group a rank that refuses the step still joins the step's collective
            # (agree_step), so that the others raise too instead of waiting for it.
            try:
                configs = self._prepare_step()
            except Exception as e:
                _torch_dist.agree_step(self._process_group, [len(s.params) for s in self._sharded_tasks], None,
                                       None, error=e)
                raise
        # The scaler's verdict before anything of the step runs (see _amp_skip).
        self._amp_skipped = _amp_skip(grad_scale, found_inf)
        if self._amp_skipped and self._process_group is not None:
            # Every rank must skip together: the verdict rides in the step's one collective.
            tasks = self._sharded_tasks
            _torch_dist.agree_step(self._process_group, [len(s.params) for s in tasks], [[] for _ in tasks],
                                   *self._agreement(configs), amp_skip=True)
        if self._amp_skipped:
            for shared in self._shared():  # counted as the core counts its own skips
                shared.task.count_skipped_step()
            return loss
        if self._process_group is None:
            for shared in self._shared():
                shared.step(grad_scale)
                self._state_of_first_steps(shared)
            return loss
        # One collective for the whole optimizer before any Task steps: every Task's mask and
        # the digest of the configuration this rank steps with (a hyperparameter changed on one
        # rank only is refused on every rank). A Task whose groups were all removed is not
        # stepped (its mask: every parameter).
        stepping = {id(s) for s in self._shared()}
        tasks = self._sharded_tasks
        missings = [s.collect_missing() if id(s) in stepping else list(range(len(s.params))) for s in tasks]
        lines, words = self._agreement(configs)
        _torch_dist.agree_step(self._process_group, [len(s.params) for s in tasks], missings, lines, words=words)
        for s, missing in zip(tasks, missings):
            if id(s) in stepping:
                s.finish_step(missing, grad_scale)
                self._state_of_first_steps(s)
        return loss

    def _prepare_step(self):
        """The binding followed and every group's hyperparameters validated, then applied to the
        Tasks' scalars. -> each param group's (kind, core hyperparameters)."""
        self._check_dense_grads()
        # Every group's hyperparameters are checked (values, and what the compiled step fixes)
        # before any is applied: a refused edit in one group leaves every group as it was, so
        # the other groups' edits reach the next step that is not refused.
        plan = self._binding_plan()  # checked before anything changes; applied below
        configs = []
        for b, group in zip(plan[0], self.param_groups):
            for flag in self._flags:
                _check_flag(flag, group.get(flag, _TORCH_FLAGS[flag]), type(self).__name__)
            kind, hyper = self._core_config(group)
            # Roles follow from trust_ratio and the (fixed) shapes: recomputed only when it changed.
            if group.get("trust_ratio") is not b.trust_ratio and self._roles(group) != b.roles:
                raise ValueError("cannot change trust_ratio after construction (it changes the compiled step)")
            b.check_hyper(kind, hyper)
            configs.append((kind, hyper))
        self._apply_binding_plan(plan)
        lr_batch = {}  # Tasks whose groups changed only their lr: one copy each below
        try:
            for b, (kind, hyper) in zip(self._bindings, configs):
                b.apply_hyper(kind, hyper, lr_batch)
        finally:
            # Even when the core refuses a later group's values: the lrs recorded as applied
            # reach the device.
            for shared in lr_batch.values():
                shared.flush_lrs()
        return configs

    def _check_dense_grads(self):
        """A sparse gradient (nn.Embedding(sparse=True), a .grad made with to_sparse()) is refused
        before anything of the step changes: the arena holds dense gradients only."""
        for gi, group in enumerate(self.param_groups):
            for j, p in enumerate(group["params"]):
                g = p.grad
                if g is not None and g.layout is not torch.strided:
                    raise RuntimeError(_sparse_grad_text(type(self), j, gi))

    def _agreement(self, configs):
        """-> (lines, digest words) of the configuration this rank steps with, for agree_step. They
        are remade only when a group's configuration or the groups' order changed (a comparison of
        small dicts per step, not a hash)."""
        key = ([id(g["params"]) for g in self.param_groups], configs)
        if key != getattr(self, "_agree_key", None):
            lines = self._agreement_lines(configs)
            self._agree_key, self._agree_lines = key, (lines, _torch_dist.digest_words(lines))
        return self._agree_lines

    def _agreement_lines(self, configs):
        """This optimizer's whole configuration as (name, value) strings, in one fixed order: what
        every rank of a process group must hold alike (_torch_dist.attach at construction and
        add_param_group, agree_step at every step): the class, grad_reduce, seed, master_weights,
        stochastic_rounding, and per param group its parameters (dtype; count, device, shapes and
        roles digested), its algorithm and every hyperparameter as the core runs it
        (`configs`: each group's (kind, hyper) from _core_config). threads may differ (the bits
        do not depend on it)."""
        lines = [("class", type(self).__name__), ("grad_reduce", self._grad_reduce), ("seed", str(self._seed)),
                 ("master_weights", str(self._master_weights)),
                 ("stochastic_rounding", str(self._rounding == "stochastic")),
                 ("len(param_groups)", str(len(self.param_groups)))]
        for i, (group, (kind, hyper)) in enumerate(zip(self.param_groups, configs)):
            dtype, layout = self._layout_text(group)
            lines.append(("param_groups[%d] dtype" % i, dtype))
            lines.append(("param_groups[%d] parameters" % i, layout))
            lines.append(("param_groups[%d] algorithm" % i, kind))
            for k, v in hyper.items():
                if "aux_lr" in hyper and k in ("lr", "weight_decay"):
                    continue  # an aux AdamW group's: aux_lr's copy and a constant 0 (named by aux_*)
                value = _AGREE_VALUES[k].get(v, repr(v)) if k in _AGREE_VALUES else repr(v)
                lines.append(("param_groups[%d]%s" % (i, _AGREE_NAMES.get(k, "[%r]" % k)), value))
            if "max_grad_norm" not in hyper:
                lines.append(("param_groups[%d]['max_grad_norm']" % i, "None"))
        return lines

    def _layout_text(self, group):
        """(dtype, "N tensors on DEVICE, shapes and roles DIGEST") of a group's parameters; kept per
        parameter list (fixed after binding), so a step recomputes it only for a new list."""
        params = group["params"]
        cache = self.__dict__.setdefault("_layout_texts", {})
        hit = cache.get(id(params))
        if hit is not None and hit[0] is params and hit[1] == len(params) and hit[2] is group.get("trust_ratio"):
            return hit[3]
        shapes = repr([(tuple(p.shape), str(p.dtype)) for p in params]) + repr(self._roles(group))
        text = (" ".join(sorted({str(p.dtype).replace("torch.", "") for p in params})),
                "%d tensors on %s, shapes and roles %s" % (
                    len(params), ", ".join(sorted({p.device.type for p in params})),
                    hashlib.blake2b(shapes.encode(), digest_size=6).hexdigest()))
        cache[id(params)] = (params, len(params), group.get("trust_ratio"), text)
        return text

    # ---- state ------------------------------------------------------------------------------
    def _refresh_state(self):
        """self.state holds live views of M, V and, as `step`, each parameter's applied-step count
        (its own with the per-tensor mask; else its Task's). A parameter that has not had an
        applied step has no state, as in torch (which makes it at the first step with a gradient)."""
        steps = {}
        for b in self._bindings:
            if id(b.shared) not in steps:
                steps[id(b.shared)] = b.shared.task.tensor_steps
                b.shared.unstepped = set()
            per = steps[id(b.shared)]
            on_device = self._step_on_device(b)
            for j, p in enumerate(b.params):
                if b.kind == "sgd":
                    self._plain_sgd_state(b, j, per[b.ids[j]])
                    if per[b.ids[j]] == 0:
                        b.shared.unstepped.add(b.ids[j])
                    continue
                if per[b.ids[j]] == 0:
                    self.state.pop(p, None)
                    b.shared.unstepped.add(b.ids[j])
                    continue
                st = b.state_of(j, _step_tensor(per[b.ids[j]], p, on_device) if "step" in b.state_names else None)
                if st:
                    self.state[p] = st

    def _step_on_device(self, b):
        """Whether binding b's group keeps `step` on its parameters' device: torch's rule, with
        fused or capturable set (Adam's and AdamW's _init_group, and load_state_dict's
        _process_value_according_to_param_policy), else a CPU float32 scalar."""
        for g in self.param_groups:
            if g["params"] is b.group_params:
                return bool(g.get("fused") or g.get("capturable"))
        return False

    def _state_of_first_steps(self, shared):
        """After a step: the parameters of `shared` that had their first applied step get their
        state (torch makes it then). Cheap while none is waiting, or none waiting had a gradient."""
        waiting = getattr(shared, "unstepped", None)
        if not waiting or waiting.issubset(shared.mask_written):
            return
        counts = shared.task.tensor_steps
        for b in self._bindings:
            if b.shared is not shared:
                continue
            on_device = None
            for j, p in enumerate(b.params):
                k = b.ids[j]
                if k in waiting and counts[k] > 0:
                    waiting.discard(k)
                    if b.kind == "sgd":
                        self._plain_sgd_state(b, j, counts[k])
                        continue
                    if on_device is None:
                        on_device = self._step_on_device(b)
                    st = b.state_of(j, _step_tensor(counts[k], p, on_device) if "step" in b.state_names else None)
                    if st:
                        self.state[p] = st

    def _plain_sgd_state(self, b, j, count):
        """The state of parameter j of binding b, a group of kind sgd (SGD with momentum 0), as the
        installed torch keeps it: torch >= 2 keeps none, torch 1.13 {'momentum_buffer': None} once
        the parameter stepped (_torch_plain_sgd_state). Like torch's, the entry is plain data that a
        step only adds those keys to: what load_state_dict put there stays (a checkpoint of the
        other torch version included). A bf16/fp16 group's 'master_weight' is its live view."""
        p = b.params[j]
        st = self.state.get(p)
        template = _torch_plain_sgd_state() if count > 0 else None
        own = b.state_of(j, None)  # master_weight only: the kind keeps no M and no step here
        if st is None and template is None and not own:
            return
        st = self.state.setdefault(p, {})
        st.update(template or {})
        st.update(own)

    def state_dict(self):
        """torch's format: {'state': {index: {'step', 'exp_avg', ...}}, 'param_groups': [...]}. The
        tensors are the live arena views (as torch's own state is live); 'step' is the parameter's
        applied-step count, as torch keeps it (a parameter skipped for a None gradient lags behind);
        under a process group's sharded step (no per-tensor mask yet) its Task's count."""
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        if not self._bind_pending():
            sd = self._packed_state_dict()  # parameters on meta: no state yet, as torch before a step
            for post_hook in self._optimizer_state_dict_post_hooks.values():
                result = post_hook(self, sd)
                if result is not None:
                    sd = result
            return sd
        self._follow_params(repeats=True)  # a group listed again is packed as torch packs it
        self._gather_state()
        self._refresh_state()
        sd = self._packed_state_dict()
        # Sliced Tasks (process_group): M and V gathered per parameter (collective, in order).
        # The core's read_state takes each rank's part of the parameter's slice range: a Muon
        # matrix lies whole in its owner's slice (rule M), so its momentum comes from the owner.
        index = 0
        for b in self._bindings:
            for j in range(len(b.params)):
                if b.shared.sliced and b.params[j] in self.state:  # state only once it stepped
                    st = sd["state"].setdefault(index, {})
                    for fam in ("M", "V", "VMAX"):
                        if fam in b.state_names:
                            t = torch.from_numpy(b.shared.sharded.read_state(fam, b.ids[j]))
                            st[b.state_names[fam]] = torch.view_as_complex(t) if b.params[j].is_complex() else t
                index += 1
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            result = post_hook(self, sd)
            if result is not None:
                sd = result
        return sd

    def _packed_state_dict(self):
        """torch's state_dict() body (without its hooks, which state_dict() runs itself, on every
        torch version): the groups with their parameters as indices, the state keyed by them."""
        mapping = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for p in group["params"]:
                mapping.setdefault(id(p), len(mapping))
            packed["params"] = [mapping[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {(mapping[id(k)] if isinstance(k, torch.Tensor) else k): v for k, v in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Loads a torch.optim (or renaissance.torch) state dict of the same groups. Checked before
        anything changes: group sizes, buffer shapes; parameters at different steps (torch's after
        None gradients) need the per-tensor mask (not under a process group's sharded step yet)."""
        state_dict = state_dict.copy()  # shallow, as torch: the pre-hooks may edit it
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            result = pre_hook(self, state_dict)
            if result is not None:
                state_dict = result
        self._follow_params()
        groups = state_dict["param_groups"]
        if len(groups) != len(self._bindings):
            raise ValueError("loaded state dict has a different number of parameter groups (%d in the state dict, "
                             "%d here)" % (len(groups), len(self._bindings)))
        for gi, g in enumerate(groups):  # another class's dict: refused before anything else
            self._check_group_keys(gi, g)
        state_keys = set(self._state_names.values()) | {"master_weight"}  # amsgrad's too, checked per group below
        state_keys |= {n for b in self._bindings for n in b.state_names.values()}  # per group (MuonWithAuxAdam)
        for gi, g in enumerate(groups):
            for j, k in enumerate(g["params"]):
                foreign = sorted(set(state_dict["state"].get(k) or ()) - state_keys)
                if foreign:
                    raise ValueError("load_state_dict: parameter %d of param group %d has state %s, which a %s does "
                                     "not keep (its state: %s): a state dict of another optimizer class" %
                                     (j, gi, ", ".join(map(repr, foreign)), type(self).__name__,
                                      ", ".join(map(repr, sorted(state_keys)))))
        plan = []
        for gi, (g, b) in enumerate(zip(groups, self._bindings)):
            if len(g["params"]) != len(b.params):
                raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                                 "optimizer's group (group %d: %d parameters here, %d in the state dict)" %
                                 (gi, len(b.params), len(g["params"])))
            # The loaded hyperparameters must fit the compiled step (checked now, applied below).
            merged = dict(self.defaults)
            merged.update({k: v for k, v in g.items() if k != "params"})
            merged["params"] = b.params
            for flag in self._flags:
                _check_flag(flag, merged.get(flag, _TORCH_FLAGS[flag]), type(self).__name__)
            try:
                kind, hyper = self._core_config(merged)
            except (ValueError, TypeError) as e:
                raise type(e)("load_state_dict: param group %d: %s" % (gi, e)) from None
            if kind != b.kind or self._roles(merged) != b.roles or hyper.get("max_grad_norm") != b.hyper.get("max_grad_norm"):
                raise ValueError("load_state_dict: param group %d needs another compiled step (%s%s) than this "
                                 "optimizer's (%s); build the optimizer with the same settings" %
                                 (gi, kind, ", clipping" if "max_grad_norm" in hyper else "", b.kind))
            try:
                b.check_hyper(kind, hyper)  # the core's range rules too, before anything is loaded
            except (ValueError, TypeError) as e:
                raise type(e)("load_state_dict: param group %d: %s" % (gi, e)) from None
            states = [state_dict["state"].get(k) for k in g["params"]]
            # No state: the parameter never stepped. torch's SGD keeps no `step`: a state with a
            # momentum_buffer has stepped at least once (its next step is dampened; the core's
            # first applied step is not: docs/math.md).
            per_param = [_step_of(s) if _step_of(s) is not None else (1 if _has_buffer(s, b.state_names) else 0)
                         for s in states]
            step = max(per_param, default=0)  # the Task's count; each parameter keeps its own below
            bufs = []  # a buffer the state lacks (or holds as None) starts at zero, as in torch
            for j, s in enumerate(states):
                for fam, key in b.state_names.items():
                    if fam == "step" or not s or s.get(key) is None:
                        continue
                    t = s[key]
                    if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(b.params[j].shape):
                        raise ValueError("load_state_dict: group %d parameter %d: '%s' is not a tensor of the "
                                         "parameter's shape %s" % (gi, j, key, tuple(b.params[j].shape)))
                    if t.is_complex() != b.params[j].is_complex():
                        raise ValueError("load_state_dict: group %d parameter %d: '%s' is %s for a %s parameter" %
                                         (gi, j, key, t.dtype, b.params[j].dtype))
                    # A copy taken now: the state dict may hold this optimizer's own live views
                    # (opt.load_state_dict(opt.state_dict())), which the load zeroes below. A
                    # complex parameter's state goes in as its real view, as the arena holds it.
                    if t.is_complex():
                        t = torch.view_as_real(t.detach().to(dtype=torch.complex64, copy=True))
                    bufs.append(((fam, b.ids[j]) if b.shared.sliced else getattr(b, fam)[j],
                                 t.detach().to(dtype=torch.float32, copy=True)))
            plan.append((b, step, bufs, per_param))
        shared_steps = {}  # the groups of one Task: its count is the largest of their parameters'
        for b, step, _, _ in plan:
            shared_steps[id(b.shared)] = max(shared_steps.get(id(b.shared), 0), step)
        # torch's group update: the loaded groups (deep copies) with this optimizer's parameters;
        # torch >= 2.6: the loaded names replace this optimizer's, a state dict without names
        # leaves them as they are.
        new_groups = copy.deepcopy(groups)
        for own, new in zip(self.param_groups, new_groups):
            new["params"] = own["params"]
            if "param_names" in own and "param_names" not in new:
                new["param_names"] = own["param_names"]
        tensor_steps = {}  # every parameter's own count, per Task
        with torch.no_grad():
            for b, step, bufs, per_param in plan:
                for view in (b.M or []) + (b.V or []) + (b.VMAX or []):
                    view.zero_()
                if b.C is not None:
                    # bf16/fp16: a state without 'master_weight' (torch's own) gives masters equal
                    # to the parameters as they are now (load the model's state dict first).
                    b.shared.masters_from_params(b.ids)
                if b.shared.sliced:  # no views: the Task keeps this rank's slice of each write
                    for j, p in zip(b.ids, b.params):
                        for fam in ("M", "V", "VMAX"):
                            if fam in b.state_names:
                                shape = tuple(p.shape) + ((2,) if p.is_complex() else ())  # the arena's
                                b.shared.task.set_state(fam, j, np.zeros(shape, dtype=np.float32))
                for view, t in bufs:
                    if isinstance(view, tuple):
                        b.shared.task.set_state(view[0], view[1],
                                                t.detach().to(device="cpu", dtype=torch.float32).contiguous().numpy())
                        continue
                    view.copy_(t.detach().to(device=view.device, dtype=torch.float32))
                counts = tensor_steps.setdefault(id(b.shared), (b.shared, [0] * len(b.shared.params)))[1]
                for j, s in zip(b.ids, per_param):
                    counts[j] = int(s)
                b.shared.task.set_step_count(int(shared_steps[id(b.shared)]))
            for shared, counts in tensor_steps.values():
                shared.task.set_tensor_steps(counts)
        self.state.clear()  # the same mapping (whoever holds opt.state sees the load)
        # SGD with momentum 0: its state is whatever torch keeps there (_plain_sgd_state), loaded
        # as torch loads it (a copy); the masters went in above.
        for b, g in zip(self._bindings, groups):
            if b.kind != "sgd":
                continue
            for p, k in zip(b.params, g["params"]):
                s = state_dict["state"].get(k)
                if s is not None:
                    self.state[p] = {key: v.detach().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
                                     for key, v in s.items() if key != "master_weight"}
        self.__setstate__({"state": self.state, "param_groups": new_groups})
        self._refresh_state()  # the state: live views of the arena, as loaded
        for b, group in zip(self._bindings, self.param_groups):
            b.apply_hyper(*self._core_config(group))
        # Last, as torch: what a post-hook changes (param_groups, the state's views) stays.
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    def _check_group_keys(self, gi, g):
        """A state dict's group against this class's keys (_required_keys, _group_keys)."""
        keys = set(g) - {"params"}
        foreign = sorted((keys & _ALL_GROUP_KEYS) - set(self._group_keys))
        missing = sorted(set(self._required_keys) - keys)
        if not foreign and not missing:
            return
        said = []
        if foreign:
            said.append("has %s" % ", ".join(map(repr, foreign)))
        if missing:
            said.append("lacks %s" % ", ".join(map(repr, missing)))
        like = [c.__name__ for c in _CLASSES if c is not type(self) and not set(c._required_keys) - keys
                and not (keys & _ALL_GROUP_KEYS) - set(c._group_keys)]
        raise ValueError("load_state_dict: param group %d does not fit %s: it %s%s; refused, nothing changed "
                         "(a state dict loads into the class that wrote it, or its torch.optim counterpart)" %
                         (gi, type(self).__name__, " and ".join(said),
                          " (the keys of a %s state dict)" % " or ".join(like) if like else ""))

    def __setstate__(self, state):
        # A torch.optim state dict lacks this library's group keys (decoupled_weight_decay,
        # max_grad_norm, trust_ratio): they take this optimizer's defaults, as torch does for
        # keys older versions lacked.
        super().__setstate__(state)
        for table in _HOOK_TABLES:
            if table not in self.__dict__:
                setattr(self, table, OrderedDict())
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)

    # ---- copies ------------------------------------------------------------------------------
    def __deepcopy__(self, memo):
        """torch's behaviour: an independent optimizer over deep copies of the parameters (the
        ones the same deepcopy call copies, e.g. with the model), with this one's groups, state and
        step counts; its arena is its own, so stepping one leaves the other as it was."""
        if self._process_group is not None:
            raise TypeError("%s: an optimizer over a process group cannot be deep-copied (the copy "
                            "would need its own handshake with every rank); build a new one" % type(self).__name__)
        groups = []
        for group in self.param_groups:
            g = {k: copy.deepcopy(v, memo) for k, v in group.items() if k != "params"}
            g["params"] = [copy.deepcopy(p, memo) for p in group["params"]]
            groups.append(g)
        clone = type(self)(groups, threads=self._threads, master_weights=self._master_weights,
                           stochastic_rounding=self._rounding == "stochastic", seed=self._seed)
        memo[id(self)] = clone
        sd = self.state_dict()
        if not self._pending:  # else nothing to load: no state before the first bound step
            clone.load_state_dict(sd)
        return clone

    def __reduce_ex__(self, protocol):
        # Refused when pickling, not at the first use of a broken object after unpickling.
        raise TypeError("cannot pickle a %s: its parameters and state live in a compiled Task; pickle "
                        "opt.state_dict() and load it into a new optimizer" % type(self).__name__)

    # ---- the library's own ------------------------------------------------------------------
    def fingerprint(self):
        """The XXH3 of W, M, V and the step count, as `renaissance run` prints it: one group: its
        16 hex digits; several: renaissance.combine_fingerprints of the groups' fingerprints in
        group order (the value a replay case's expected_fingerprint holds, docs/replay-format.md).
        A group's fingerprint is that of its tensors alone with its Task's step count."""
        self._follow_params()
        self._gather_state()
        return _core.combine_fingerprints([b.task.fingerprint() for b in self._bindings])

    def _gather_state(self):
        """With a process_group: every rank updated only its slice of M and V; all-gather them so
        that the whole-state reads (state_dict, fingerprint, save) see one device's state. A
        collective: every rank of the group calls it."""
        for shared in self._shared():
            if shared.sharded is not None and not shared.sliced:
                shared.sharded.gather_state()

    def _paths(self, path):
        path = str(path)
        tasks = self._shared()
        if len(tasks) == 1:
            return [path]
        return ["%s.task%d" % (path, i) for i in range(len(tasks))]

    def save(self, path):
        """The library's atomic checkpoint (weights, state, step counts, every group's scalars):
        `path` for one Task; with several Tasks a set, all or none: every Task's file is first
        written to a temporary, then they replace `path.task0`, `path.task1`, ... and last a
        manifest at `path` names them with their digests (a save that fails part-way leaves a set
        that load() refuses, never one it loads half of). With a process_group: a collective; the
        group's rank 0 writes the whole (gathered) state, and every rank returns once it is written
        (or raises when rank 0 could not write it)."""
        self._follow_params()
        self._gather_state()
        tasks, paths = self._shared(), self._paths(path)
        if len(tasks) == 1:
            self._save_task(tasks[0], paths[0])
            return
        writer = self._process_group is None or dist.get_rank(self._process_group) == 0
        temps = ["%s.tmp-%d-%d" % (p, os.getpid(), i) for i, p in enumerate(paths)]
        error = None
        try:
            for shared, tmp in zip(tasks, temps):
                self._save_task(shared, tmp)
            if writer:
                for tmp, p in zip(temps, paths):
                    os.replace(tmp, p)
                _checkpoint_set.write_manifest(str(path), paths, tasks)
        except Exception as e:  # noqa: BLE001  (raised below, after the other ranks heard of it)
            error = e
        finally:
            if writer:
                for tmp in temps:
                    _checkpoint_set.remove_quietly(tmp)
        if self._process_group is not None:
            # Every rank returns once the manifest is written, or raises when rank 0 could not.
            failed = _torch_dist.flag_max(self._process_group, 0 if error is None else 1)
            if error is None and failed:
                raise RuntimeError("%s.save(%r): rank 0 of the process group could not write the checkpoint set" %
                                   (type(self).__name__, str(path)))
        if error is not None:
            raise error

    @staticmethod
    def _save_task(shared, path):
        if shared.sliced:
            shared.sharded.save(path)  # gathered; written by the group's rank 0
        else:
            shared.task.save(path)

    def load(self, path):
        """Loads what save(path) wrote, in place, all or nothing. One Task: the core's load (a
        failed load leaves the Task as it was). Several: the manifest, the files' digests and what
        each Task was saved as are checked before anything is loaded; a mixed or incomplete set is
        refused, nothing changed."""
        self._follow_params()
        tasks, paths = self._shared(), self._paths(path)
        cls = type(self).__name__
        if len(tasks) == 1:
            if _checkpoint_set.is_manifest(paths[0]):
                raise ValueError("%s.load(%r): a checkpoint set of several Tasks; this optimizer has one Task "
                                 "(another grouping of the parameters, dtypes or settings)" % (cls, str(path)))
        else:
            _checkpoint_set.check(str(path), paths, tasks, cls)
        # A Task loaded before a later one fails is put back from a copy of its state taken just
        # before (the checks above leave only errors such as I/O to reach here). A sliced Task (a
        # process_group) has no local copy to take; the checks stand alone there.
        backup = tempfile.mkdtemp(prefix="renaissance-load-") if len(tasks) > 1 else None
        done = []
        try:
            for i, (shared, p) in enumerate(zip(tasks, paths)):
                if backup is not None and i < len(tasks) - 1 and not shared.sliced:
                    shared.task.save(os.path.join(backup, "task%d" % i))
                shared.task.load(p)
                done.append(i)
                # The checkpoint brought its own hyperparameters and loss scale: back to the ones
                # last applied from param_groups, and the scale slots to 1 at the next plain step.
                shared.reapply_hyper()
                shared.amp_used = True
        except BaseException:
            for i in done:
                if not tasks[i].sliced:
                    tasks[i].task.load(os.path.join(backup, "task%d" % i))
                    tasks[i].reapply_hyper()
            raise
        finally:
            if backup is not None:
                shutil.rmtree(backup, ignore_errors=True)
            self._refresh_state()

    @property
    def backends(self):
        return [shared.task.backend for shared in self._shared()]


# ---- construction checks ------------------------------------------------------------------------
def _register(table, hook, prepend):
    handle = RemovableHandle(table)
    table[handle.id] = hook
    if prepend:
        table.move_to_end(handle.id, last=False)
    return handle


def _param_list(params):
    if isinstance(params, torch.Tensor):
        return [params]
    if isinstance(params, set):
        raise TypeError("optimizer parameters need to be organized in ordered collections, but the ordering of "
                        "tensors in sets will change between runs. Please use a list instead.")
    return list(params)


def _split_names(group):
    """torch >= 2.6's named parameters, whatever torch is installed: (name, tensor) pairs (e.g.
    model.named_parameters()) become the tensors in 'params' and their names in 'param_names';
    a group naming some of its parameters only is torch's ValueError."""
    tensors, names = [], []
    for p in _param_list(group["params"]):
        if isinstance(p, tuple):
            names.append(p[0])
            tensors.append(p[1])
        else:
            tensors.append(p)
    group["params"] = tensors
    if names:
        if len(names) != len(tensors):
            raise ValueError("all optimizer params should be with/without names. Some param names are missing")
        group["param_names"] = names
    return group


def _check_names(groups, existing):
    """torch's rule: every param group of an optimizer has names, or none has."""
    seen = list(existing)
    for group in groups:
        for g in seen:
            if ("param_names" in group) != ("param_names" in g):
                raise ValueError("all optimizer param groups should be with/without names. cannot add param group "
                                 "%s to the optimizer" % ("with names" if "param_names" in group else "without names"))
        seen.append(group)


def _as_groups(params):
    if isinstance(params, torch.Tensor):
        raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                        "but got " + torch.typename(params))
    params = _param_list(params)
    if not params:
        raise ValueError("optimizer got an empty parameter list")
    if isinstance(params[0], dict):
        return [_split_names(dict(g)) for g in params]
    return [_split_names({"params": params})]


def _fused_device_error(p):
    # torch's type and text for its fused step on a device it has no fused kernel for (e.g.
    # meta); the library's step is always fused.
    return RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported "
                        "devices: ['cpu', 'cuda'] but %s and %s (renaissance.torch's step is always fused; "
                        "it runs on cpu and cuda)" % (p.dtype, p.device.type))


def _validate_new(groups, existing, defer=False):
    """Every error of the adapter's contract (ValueError; torch's RuntimeError for a device without the fused
    step), before any parameter or task is touched. defer: a parameter on such a device (meta) passes
    (checked again when bound, see _Base._bind_pending)."""
    seen = {id(p) for p in existing}
    intervals = [tensor_interval(p) + (p,) for p in existing if p.numel() > 0]
    devices = {p.device for p in existing}
    for gi, group in enumerate(groups):
        if not group["params"]:
            raise ValueError("param group %d has no parameters" % gi)
        in_group = set()
        for p in group["params"]:
            if not isinstance(p, torch.Tensor):
                raise TypeError("optimizer can only optimize Tensors, but one of the params is " + torch.typename(p))
            if p.layout is not torch.strided:  # first: a sparse tensor has no data pointer to check
                raise ValueError("parameter of shape %s is a sparse tensor (%s): renaissance.torch takes dense "
                                 "(strided) parameters" % (tuple(p.shape), p.layout))
            # torch's error (type and text) for a parameter in two groups. Twice in one group
            # torch only warns, and then updates it twice per step (once per listing); the arena
            # holds a parameter once and steps it once, so that is refused here (stricter).
            if id(p) in in_group:
                raise ValueError("a parameter (shape %s) is listed twice in param group %d: torch warns (\"optimizer "
                                 "contains a parameter group with duplicate parameters; in future, this will cause "
                                 "an error\") and updates it twice per step; renaissance.torch steps each parameter "
                                 "once and refuses it" % (tuple(p.shape), gi))
            if id(p) in seen:
                raise ValueError("some parameters appear in more than one parameter group (a parameter of shape %s)"
                                 % (tuple(p.shape),))
            in_group.add(id(p))
            seen.add(id(p))
            devices.add(p.device)
            if len(devices) > 1:
                raise ValueError("parameters on different devices (%s): one optimizer takes one device" % ", ".join(sorted(map(str, devices))))
            if p.dtype not in _PRECISION:
                raise ValueError("parameter of shape %s is %s: renaissance.torch takes %s parameters"
                                 % (tuple(p.shape), p.dtype, _PRECISION_TEXT))
            first = group["params"][0].dtype
            if _PRECISION[p.dtype] != _PRECISION.get(first):  # float32 and complex64 share the fp32 arena
                raise ValueError("param group %d mixes %s and %s parameters: one dtype per param group (put each "
                                 "dtype in a group of its own)" % (gi, first, p.dtype))
            # A non-contiguous parameter is copied into the arena like any other and then views
            # it, so it becomes contiguous (docs/python.md). One whose elements share memory
            # (an expand()ed tensor) cannot become one tensor of its own elements: refused, as
            # torch's in-place update refuses to write it.
            if not p.is_contiguous() and _self_overlapping(p):
                raise ValueError("parameter of shape %s (strides %s) has elements that share memory; the optimizer "
                                 "writes every element: pass p.clone() or a contiguous tensor" %
                                 (tuple(p.shape), tuple(p.stride())))
            if p.device.type not in _DEVICES:
                if not defer:
                    raise _fused_device_error(p)
                continue  # no memory to check (meta)
            if p.device.type == "cuda" and not _core.with_cuda:
                raise ValueError("parameter on %s but this renaissance build has no CUDA backend" % p.device)
            if p.numel() > 0:
                lo, hi = tensor_interval(p)
                for a, b, q in intervals:
                    if lo < b and a < hi:
                        raise ValueError("parameters of shapes %s and %s overlap in memory" % (tuple(q.shape), tuple(p.shape)))
                intervals.append((lo, hi, p))


def _self_overlapping(p):
    """Whether two elements of strided tensor p share memory (sufficient test: along the dims
    sorted by stride, each stride passes the span of the dims before it; else counted as
    overlapping)."""
    span = 0
    dims = sorted(((st, n) for n, st in zip(p.shape, p.stride()) if n > 1))
    for st, n in dims:
        if st <= span:
            return True
        span += (n - 1) * st
    return False


def _check_flag(name, value, cls):
    """A torch flag's value, at construction, in every group at step() and in a loaded group."""
    if name in ("foreach", "fused"):  # None: torch picks; here the one step either way
        if value is not None and not isinstance(value, bool):
            raise ValueError("%s: %s=%r: expected True, False or None" % (cls, name, value))
    elif name == "capturable":
        if value is not None and not isinstance(value, bool):  # None: False, as torch reads it
            raise ValueError("%s: capturable=%r: expected True, False or None" % (cls, value))
    elif name == "differentiable":
        if value != False:  # noqa: E712  (0 is False, as before)
            # torch's type and text for differentiable with its fused step, which is the only one here.
            raise RuntimeError("`fused` does not support `differentiable` (%s: the library's step is always "
                               "fused; differentiable=%r is not supported)" % (cls, value))
    elif name == "maximize":
        _maximize_value(value, cls)
    elif name == "amsgrad":
        _amsgrad_value(value, cls)
    elif value != False:  # noqa: E712
        raise ValueError("%s: %s=%r is not supported" % (cls, name, value))


def _amsgrad_value(value, cls):
    """amsgrad as a bool (True or False only, as maximize: the flag adds a state buffer)."""
    if not isinstance(value, bool):
        raise ValueError("%s: amsgrad=%r: expected True or False" % (cls, value))
    return value


def _maximize_value(value, cls):
    """maximize as a bool (torch reads it for its truth; this library takes True or False only,
    so that a stray value cannot turn a minimization into a maximization)."""
    if not isinstance(value, bool):
        raise ValueError("%s: maximize=%r: expected True or False" % (cls, value))
    return value


def _torch_state(kind, amsgrad=False, group="weight"):
    """torch's per-parameter state keys of a group ("weight" or "bias_like") of a core kind: the
    core's {family: key} (its family and kind tables), and "step", each parameter's applied-step
    count, which every class keeps (torch's SGD and Muon do not)."""
    return dict(_core.torch_state_keys(kind, amsgrad, group), step="step")


_PLAIN_SGD_STATE = []


def _torch_plain_sgd_state():
    """What the installed torch.optim.SGD keeps for a parameter it stepped with momentum 0, found
    once by stepping it: None (no state: torch >= 2) or that state ({'momentum_buffer': None}:
    torch 1.13, whose step stores every parameter's buffer, None without momentum)."""
    if not _PLAIN_SGD_STATE:
        p = torch.zeros(1, requires_grad=True)
        p.grad = torch.ones(1)
        opt = torch.optim.SGD([p], lr=0.1)
        opt.step()
        st = opt.state_dict()["state"]
        _PLAIN_SGD_STATE.append(dict(st[0]) if 0 in st else None)
    return _PLAIN_SGD_STATE[0]


def _has_buffer(state, state_names):
    """Whether a loaded state holds one of the class's buffers (not None)."""
    return bool(state) and any(state.get(key) is not None for fam, key in state_names.items() if fam != "step")


def _step_tensor(count, p, on_device):
    """A parameter's `step` as torch keeps it: a float32 scalar, on the parameter's device when
    its group has fused or capturable set, else on the CPU."""
    return torch.tensor(float(count), dtype=torch.float32, device=p.device if on_device else "cpu")


def _step_of(state):
    """A state's step count, checked before the load changes anything: a whole number in
    [0, 2^31) (the core's per-tensor counts), as torch writes it (a float tensor or a number)."""
    if not state or state.get("step") is None:
        return None
    s = state["step"]
    v = s.item() if isinstance(s, torch.Tensor) and s.numel() == 1 else s
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v) \
            or not 0 <= v < 2 ** 31:
        raise ValueError("load_state_dict: step=%r: expected a whole number in [0, 2**31)" % (s,))
    return int(v)


def _sparse_grad_text(cls, j, gi):
    """The refusal of a sparse gradient: torch's own text where its class refuses one too (its
    Adam and AdamW), else renaissance.torch's (torch's SGD steps sparse gradients)."""
    where = "parameter %d of param_groups[%d]" % (j, gi)
    if issubclass(cls, Muon):  # torch's Muon refuses them too
        return "Muon does not support sparse gradients (renaissance.torch: %s)" % where
    if issubclass(cls, Adam):
        return "%s does not support sparse gradients, please consider SparseAdam instead (renaissance.torch: %s)" % (
            cls.__name__, where)
    return ("%s: sparse gradients are not supported by renaissance.torch (%s); use torch.optim.SparseAdam or "
            "torch.optim.SGD" % (cls.__name__, where))


def _scale_from_scaler(scaler, optimizer):
    """torch 1.x: GradScaler.step(opt) passes grad_scaler=self. Do what torch 2.x does before it
    calls step(): record the inf check if unscale_() has not, and take the scale unless the
    gradients are already unscaled."""
    from torch.cuda.amp.grad_scaler import OptState
    state = scaler._per_optimizer_states[id(optimizer)]
    if state["stage"] is OptState.READY:
        scaler._check_inf_per_device(optimizer)
    found = list(state["found_inf_per_device"].values())  # from that check or from unscale_()
    found_inf = sum(f.double().sum().cpu() for f in found) if found else None
    return (None if state["stage"] is OptState.UNSCALED else scaler._get_scale_async()), found_inf


def _multi_tensor_step(optimizer, *args, **kwargs):
    """The step's one implementation: every group's parameters in one fused, capturable core step
    per Task. torch's classes step through a module-level function per implementation
    (torch.optim.adamw's _multi_tensor_adamw, _fused_adamw, _single_tensor_adamw) that step()
    looks up when it runs, and torch's own tests patch the default one to see that it runs; here
    that name (_multi_tensor_sgd, _multi_tensor_adam, ...) is this function."""
    return _Base._step(optimizer, *args, **kwargs)


_multi_tensor_sgd = _multi_tensor_adam = _multi_tensor_adamw = _multi_tensor_step
_multi_tensor_lars = _multi_tensor_lion = _multi_tensor_lamb = _multi_tensor_step
_single_tensor_muon = _multi_tensor_muon_with_aux_adam = _multi_tensor_step


def _amp_skip(grad_scale, found_inf):
    """Whether the GradScaler protocol says to skip this step: a nonzero found_inf (torch skips
    the step then), or a scale whose reciprocal (formed as set_scale forms it: in double, rounded
    to float) is not finite: scale 0, NaN, or one so small that 1/scale overflows float. torch's
    unscale would turn every gradient into inf or NaN there and skip; the fused unscale would
    instead multiply the gradients by it inside the update (the core's non-finite check reads
    G before the unscale) and write NaN weights. A skip is decided here, before the core step
    runs: nothing changes and no step count advances, as in the core's own non-finite skip, and
    each Task's skipped_steps counts it. One host read of the two values (on CUDA a sync)."""
    bad = None
    if grad_scale is not None:
        scale = grad_scale if isinstance(grad_scale, torch.Tensor) else torch.tensor(float(grad_scale))
        bad = ~torch.isfinite(scale.detach().double().reciprocal().float()).all()
    if found_inf is not None:
        found = found_inf if isinstance(found_inf, torch.Tensor) else torch.tensor(float(found_inf))
        f = (found.detach() != 0).any()
        bad = f if bad is None else (bad.to(f.device) | f)
    return bad is not None and bool(bad)


def _number(name, value, tensor=False):
    """A hyperparameter as a float. tensor=True (lr; Adam's and AdamW's betas, where torch takes
    Tensors): a 1-element Tensor is read for its value (torch's check and text for more
    elements), on every step() so that in-place edits (torch 2.x's schedulers fill_ a Tensor lr)
    reach the step; a CUDA Tensor costs a host synchronisation there."""
    if isinstance(value, torch.Tensor):
        if not tensor:
            raise ValueError("%s as a tensor is not supported; pass a float" % name)
        if value.numel() != 1:
            raise ValueError("Tensor %s must be 1-element" % name)
        if value.is_complex() or not (value.is_floating_point() or value.dtype in _INT_DTYPES):
            raise ValueError("Tensor %s: expected a real number, got %s" % (name, value.dtype))
        value = value.item()
    # torch's type for a value that is not a number (a str: its range check's comparison raises
    # TypeError); a bool, which torch takes as 0 or 1, is refused too (stricter than torch).
    if isinstance(value, (bool, str)) or not isinstance(value, numbers.Real):
        raise TypeError("%s=%r: expected a number (a float), got %s" % (name, value, type(value).__name__))
    value = float(value)
    if not math.isfinite(value):
        raise ValueError("%s=%r: must be finite" % (name, value))
    return value


_INT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _at_least_zero(message, name, value, tensor=False):
    """torch's range rule and message for lr, momentum, weight_decay and eps ("Invalid learning
    rate: -1.0"). Checked by _core_config, so at construction and at every step while a bad value
    stands in param_groups (before anything of the step is applied)."""
    v = _number(name, value, tensor)
    if not v >= 0.0:
        raise ValueError("%s: %s" % (message, value))
    return v


def _lr(group):
    return _at_least_zero("Invalid learning rate", "lr", group["lr"], tensor=True)


def _lr_any(group):
    """The lr of the kinds without a torch counterpart (no range rule of torch's): a number or a
    1-element Tensor, as for the others."""
    return _number("lr", group["lr"], tensor=True)


def _weight_decay(group):
    return _at_least_zero("Invalid weight_decay value", "weight_decay", group["weight_decay"])


def _betas(group, tensor=False):
    b = group["betas"]
    if len(b) != 2:
        raise ValueError("betas=%r: expected two numbers" % (b,))
    if tensor and isinstance(b[0], torch.Tensor) != isinstance(b[1], torch.Tensor):
        raise ValueError("betas must be either both floats or both Tensors")  # torch's rule and text
    names = ("betas[0]", "betas[1]") if tensor else ("beta1", "beta2")
    out = (_number(names[0], b[0], tensor), _number(names[1], b[1], tensor))
    for i, v in enumerate(out):
        if not 0.0 <= v < 1.0:  # torch's rule and message (Adam, AdamW)
            raise ValueError("Invalid beta parameter at index %d: %s" % (i, b[i]))
    return out


def _clip(group, hyper, cls):
    """The settings every kind shares, added to a group's core hyperparameters: clipping, when
    the group sets it, and maximize (always present, so that turning it off is a change too)."""
    if group.get("max_grad_norm") is not None:
        hyper["max_grad_norm"] = _number("max_grad_norm", group["max_grad_norm"])
    hyper["maximize"] = _maximize_value(group.get("maximize", False), cls)
    return hyper


def _trust_roles(group, weight_role="fc_weight", bias_role="fc_bias"):
    tr = group.get("trust_ratio")
    if tr is not None and not isinstance(tr, bool):
        raise ValueError("trust_ratio=%r: expected None (ndim > 1) or a bool" % (tr,))
    return [weight_role if (p.dim() > 1 if tr is None else tr) else bias_role for p in group["params"]]


# ---- the optimizers -----------------------------------------------------------------------------
class SGD(_Base):
    """torch.optim.SGD semantics (L2 weight decay; decoupled_weight_decay=True for the library's
    decoupled mode), dampening included (the first step's buffer is the gradient, later steps add
    (1 - dampening) times it)."""

    _implementation = "_multi_tensor_sgd"
    _flags = ("maximize", "foreach", "differentiable", "fused")
    _state_names = _torch_state("sgd_momentum")
    _required_keys = ("momentum", "dampening", "nesterov")
    _group_keys = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "foreach", "differentiable",
                   "fused", "decoupled_weight_decay", "max_grad_norm")

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False, fused=None, decoupled_weight_decay=False,
                 max_grad_norm=None, threads=0,
                 master_weights=True, stochastic_rounding=False, seed=0,
                 process_group=None, grad_reduce="replicated"):
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
                        maximize=maximize, foreach=foreach, differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay, max_grad_norm=max_grad_norm)
        super().__init__(params, defaults, threads, master_weights, stochastic_rounding, seed,
                         process_group, grad_reduce)

    def _core_config(self, group):
        momentum = _at_least_zero("Invalid momentum value", "momentum", group["momentum"])
        # torch checks no range for dampening (a value float32 cannot hold is refused by the core).
        dampening = _number("dampening", group["dampening"])
        if group["nesterov"] and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")  # torch's text
        kind = "sgd" if momentum == 0 else ("sgd_nesterov" if group["nesterov"] else "sgd_momentum")
        hyper = {"lr": _lr(group), "weight_decay": _weight_decay(group),
                 "weight_decay_mode": "decoupled" if group["decoupled_weight_decay"] else "l2"}
        if momentum > 0:
            hyper["momentum"] = momentum
            if dampening != 0:  # without momentum torch ignores it (no buffer)
                hyper["dampening"] = dampening
        return kind, _clip(group, hyper, "SGD")


class Adam(_Base):
    """torch.optim.Adam: L2 weight decay, or with decoupled_weight_decay=True (a constructor
    default or a group key, as torch >= 2.6 has it) AdamW's decoupled decay; each group runs the
    kind its flag names (adam or adamw)."""

    _implementation = "_multi_tensor_adam"
    _flags = ("amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused")
    _state_names = _torch_state("adam", amsgrad=True)  # max_exp_avg_sq: amsgrad groups only
    _required_keys = ("betas", "eps")
    # decoupled_weight_decay: torch >= 2.6 writes it into Adam's (False) and AdamW's (True) groups.
    _group_keys = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable",
                   "differentiable", "fused", "decoupled_weight_decay", "max_grad_norm")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False, max_grad_norm=None, threads=0,
                 master_weights=True, stochastic_rounding=False, seed=0,
                 process_group=None, grad_reduce="replicated"):
        # torch's constructor rules for Tensor hyperparameters (its texts): with foreach=True and
        # capturable=False torch's implementation cannot take them; the 1-element rule is checked
        # at every step (_number).
        if isinstance(lr, torch.Tensor) and foreach and not capturable:
            raise ValueError("lr as a Tensor is not supported for capturable=False and foreach=True")
        for i, beta in enumerate(betas if isinstance(betas, (tuple, list)) else ()):
            if isinstance(beta, torch.Tensor) and foreach and not capturable:
                raise ValueError("betas[%d] as a Tensor is not supported for capturable=False and foreach=True" % i)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                        foreach=foreach, capturable=capturable, differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay, max_grad_norm=max_grad_norm)
        super().__init__(params, defaults, threads, master_weights, stochastic_rounding, seed,
                         process_group, grad_reduce)

    def _core_config(self, group):
        b1, b2 = _betas(group, tensor=True)
        hyper = {"lr": _lr(group), "beta1": b1, "beta2": b2,
                 "eps": _at_least_zero("Invalid epsilon value", "eps", group["eps"]),
                 "weight_decay": _weight_decay(group)}
        if _amsgrad_value(group.get("amsgrad", False), type(self).__name__):
            hyper["amsgrad"] = True  # only when on: a run without it keeps its keys (Recorder, replay)
        return "adamw" if group["decoupled_weight_decay"] else "adam", _clip(group, hyper, type(self).__name__)


class AdamW(Adam):
    """torch.optim.AdamW: Adam with decoupled_weight_decay=True (torch's own definition)."""

    _implementation = "_multi_tensor_adamw"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
                 max_grad_norm=None, threads=0,
                 master_weights=True, stochastic_rounding=False, seed=0,
                 process_group=None, grad_reduce="replicated"):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach, maximize=maximize,
                         capturable=capturable, differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True, max_grad_norm=max_grad_norm, threads=threads,
                         master_weights=master_weights, stochastic_rounding=stochastic_rounding, seed=seed,
                         process_group=process_group, grad_reduce=grad_reduce)


class LARS(_Base):
    """LARS (docs/math.md). A parameter gets the trust ratio and weight decay when the group's
    trust_ratio says so (default: ndim > 1); the others get plain momentum with no weight decay."""

    _implementation = "_multi_tensor_lars"
    _state_names = _torch_state("lars")
    _required_keys = ("momentum", "trust_coefficient", "eps", "nesterov")
    _group_keys = ("lr", "momentum", "weight_decay", "trust_coefficient", "eps", "nesterov", "trust_ratio",
                   "max_grad_norm", "maximize")

    def __init__(self, params, lr=_defaults_of("lars")["lr"], momentum=_defaults_of("lars")["momentum"],
                 weight_decay=_defaults_of("lars")["weight_decay"],
                 trust_coefficient=_defaults_of("lars")["trust_coefficient"], eps=_defaults_of("lars")["eps"],
                 nesterov=False, *, trust_ratio=None, max_grad_norm=None, maximize=False, threads=0,
                 master_weights=True, stochastic_rounding=False, seed=0,
                 process_group=None, grad_reduce="replicated"):
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, trust_coefficient=trust_coefficient,
                        eps=eps, nesterov=nesterov, trust_ratio=trust_ratio, max_grad_norm=max_grad_norm,
                        maximize=maximize)
        super().__init__(params, defaults, threads, master_weights, stochastic_rounding, seed,
                         process_group, grad_reduce)

    def _roles(self, group):
        return _trust_roles(group)

    def _core_config(self, group):
        return ("lars_nesterov" if group["nesterov"] else "lars"), _clip(group, {
            "lr": _lr_any(group), "momentum": _number("momentum", group["momentum"]),
            "weight_decay": _number("weight_decay", group["weight_decay"]),
            "trust_coefficient": _number("trust_coefficient", group["trust_coefficient"]),
            "eps": _number("eps", group["eps"])}, "LARS")


class Lion(_Base):
    """Lion (Chen et al. 2023; timm's Lion): every parameter gets the group's weight decay."""

    _implementation = "_multi_tensor_lion"
    _state_names = _torch_state("lion")
    _required_keys = ("betas",)
    _group_keys = ("lr", "betas", "weight_decay", "max_grad_norm", "maximize")

    def __init__(self, params, lr=_defaults_of("lion")["lr"],
                 betas=(_defaults_of("lion")["beta1"], _defaults_of("lion")["beta2"]),
                 weight_decay=_defaults_of("lion")["weight_decay"], *, max_grad_norm=None, maximize=False, threads=0,
                 master_weights=True, stochastic_rounding=False, seed=0,
                 process_group=None, grad_reduce="replicated"):
        defaults = dict(lr=lr, betas=betas, weight_decay=weight_decay, max_grad_norm=max_grad_norm, maximize=maximize)
        super().__init__(params, defaults, threads, master_weights, stochastic_rounding, seed,
                         process_group, grad_reduce)

    def _core_config(self, group):
        b1, b2 = _betas(group)
        return "lion", _clip(group, {"lr": _lr_any(group), "beta1": b1, "beta2": b2,
                                     "weight_decay": _number("weight_decay", group["weight_decay"])}, "Lion")


class LAMB(_Base):
    """LAMB (docs/math.md): trust ratio and weight decay where the group's trust_ratio says so
    (default: ndim > 1); the others take the Adam direction with r = 1 and no weight decay."""

    _implementation = "_multi_tensor_lamb"
    _state_names = _torch_state("lamb")
    _required_keys = ("betas", "eps")
    _group_keys = ("lr", "betas", "eps", "weight_decay", "trust_ratio", "max_grad_norm", "maximize")

    def __init__(self, params, lr=_defaults_of("lamb")["lr"],
                 betas=(_defaults_of("lamb")["beta1"], _defaults_of("lamb")["beta2"]),
                 eps=_defaults_of("lamb")["eps"], weight_decay=_defaults_of("lamb")["weight_decay"], *,
                 trust_ratio=None, max_grad_norm=None, maximize=False, threads=0,
                 master_weights=True, stochastic_rounding=False, seed=0,
                 process_group=None, grad_reduce="replicated"):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, trust_ratio=trust_ratio,
                        max_grad_norm=max_grad_norm, maximize=maximize)
        super().__init__(params, defaults, threads, master_weights, stochastic_rounding, seed,
                         process_group, grad_reduce)

    def _roles(self, group):
        return _trust_roles(group)

    def _core_config(self, group):
        b1, b2 = _betas(group)
        return "lamb", _clip(group, {"lr": _lr_any(group), "beta1": b1, "beta2": b2,
                                     "eps": _number("eps", group["eps"]),
                                     "weight_decay": _number("weight_decay", group["weight_decay"])}, "LAMB")


# Muon's Newton–Schulz defaults (torch.optim.Muon's, from Keller Jordan's Muon).
_NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)
_NS_EPS = 1e-7
_NS_STEPS = 5
_ADJUST_LR = {None: 0, "original": 0, "match_rms_adamw": 1}  # adjust_lr_fn -> the core's adjust_lr
_MUON_MODES = {"exact": 0, "fast": 1}  # muon_mode -> the core's muon_mode
# Core hyperparameter values -> the group's, in _Base._agreement_lines (adjust_lr 0 is torch's
# None and "original" alike: the same adjustment, so ranks that spell it differently agree).
_AGREE_VALUES = {"muon_mode": {v: repr(k) for k, v in _MUON_MODES.items()},
                 "adjust_lr": {0: repr("original"), 1: repr("match_rms_adamw")}}


def _muon_mode(value):
    """The core's muon_mode of this package's muon_mode keyword (no torch counterpart): "exact"
    (the fixed-point products, the same bits on every backend) or "fast" (fp32 products on the
    CPU; on CUDA torch's bf16 iteration, bf16 storage and products with fp32 accumulation;
    docs/math.md, "Muon: fast mode")."""
    if not isinstance(value, str) or value not in _MUON_MODES:
        raise ValueError("muon_mode %r is not supported: expected 'exact' or 'fast'" % (value,))
    return _MUON_MODES[value]


def _muon_number(message, name, value, tensor=False):
    """torch.optim.Muon's range rule and text for lr, momentum and weight_decay ("Learning rate
    should be >= 0 but is: -1.0")."""
    v = _number(name, value, tensor)
    if not v >= 0.0:
        raise ValueError("%s should be >= 0 but is: %s" % (message, value))
    return v


def _muon_matrices(group, cls, two_d):
    """The parameters of a Muon group: real (torch's RuntimeError for a complex one) and 2-D
    (torch.optim.Muon's ValueError; MuonWithAuxAdam: at least 2-D, a conv weight is viewed as
    (shape[0], prod(rest)))."""
    for p in group["params"]:
        if p.is_complex():
            raise RuntimeError("Muon does not support complex parameters")
        if two_d and p.ndim != 2:
            raise ValueError("Muon only supports 2D parameters whereas we found a parameter with size: %s" % (p.size(),))
        if not two_d and p.ndim < 2:
            raise ValueError("%s: a use_muon=True group takes matrices (2-D or more, viewed as (shape[0], prod(rest))); "
                             "a parameter has size %s: put it in a use_muon=False group" % (cls, p.size()))


def _muon_hyper(lr, weight_decay, momentum, nesterov=True, ns_coefficients=_NS_COEFFICIENTS, eps=_NS_EPS,
                ns_steps=_NS_STEPS, adjust_lr_fn=None, muon_mode="exact"):
    """The core's muon hyperparameters of a Muon group, checked as torch.optim.Muon checks them
    (its texts; the Newton–Schulz ones at construction here, at the step in torch)."""
    if len(ns_coefficients) != 3:
        raise ValueError("Coefficients must be a tuple of exactly 3 values")
    if isinstance(ns_steps, bool) or not isinstance(ns_steps, numbers.Integral):
        raise TypeError("ns_steps=%r: expected an int" % (ns_steps,))
    if ns_steps >= 100:
        raise ValueError("Number of steps must be less than 100 for computational efficiency")
    if ns_steps < 1:
        raise ValueError("ns_steps=%r: renaissance.torch's Muon runs 1 to 99 Newton-Schulz steps (torch runs none "
                         "for 0)" % (ns_steps,))
    eps = _number("eps", eps)
    if not eps > 0.0:
        raise ValueError("eps=%r: renaissance.torch's Muon takes eps > 0 (the floor of the Newton-Schulz "
                         "normalisation max(||u||_F, eps))" % (eps,))
    if adjust_lr_fn not in _ADJUST_LR:
        raise ValueError("Adjust learning rate function %s is not supported" % (adjust_lr_fn,))
    a, b, c = (_number("ns_coefficients[%d]" % i, v) for i, v in enumerate(ns_coefficients))
    return {"lr": lr, "weight_decay": weight_decay, "momentum": momentum, "nesterov": bool(nesterov),
            "ns_steps": int(ns_steps), "ns_eps": eps, "ns_a": a, "ns_b": b, "ns_c": c,
            "adjust_lr": _ADJUST_LR[adjust_lr_fn], "muon_mode": _muon_mode(muon_mode)}


class Muon(_Base):
    """torch.optim.Muon (torch >= 2.9): momentum, Newton–Schulz orthogonalisation of each 2-D
    parameter's update, decoupled weight decay and the adjusted lr (docs/math.md, "Muon"), with
    torch's signature, defaults, checks and state (`momentum_buffer`; plus `step`, the parameter's
    applied-step count, which torch's Muon does not keep). The orthogonalisation is the
    kind muon's exact product (fp32 inputs), not torch's bf16 one: the parameters agree with
    torch's within the difference of its bf16 Newton–Schulz from a float64 one. Deviations
    (docs/python.md): ns_steps >= 100, a bad ns_coefficients and complex parameters are refused
    at construction (torch: at the first step); ns_steps must be 1 to 99 and eps > 0; momentum
    takes the core's range [0, 1); adjust_lr_fn is fixed at construction. muon_mode (this package's,
    keyword-only, fixed at construction): "exact" (default) or "fast" (fp32 products on the CPU,
    bf16 with fp32 accumulation on CUDA: close to exact mode, not bitwise across backends).
    process_group= and grad_reduce= as every class: each matrix has one owner rank, which keeps
    its momentum whole and orthogonalises it (docs/distributed.md, rule M)."""

    _implementation = "_single_tensor_muon"
    # torch's Muon keeps no `step`; this class does, as this package's SGD: each parameter's own
    # applied-step count, so that a deepcopy or a load of this class's dict keeps the counts (and
    # the fingerprint). A torch dict without it loads as one step for a parameter with a buffer.
    _state_names = _torch_state("muon")
    _required_keys = ("momentum", "nesterov", "ns_coefficients", "ns_steps")
    _group_keys = ("lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps", "adjust_lr_fn",
                   "max_grad_norm", "maximize", "muon_mode")

    def __init__(self, params, lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                 ns_coefficients=_NS_COEFFICIENTS, eps=_NS_EPS, ns_steps=_NS_STEPS, adjust_lr_fn=None, *,
                 max_grad_norm=None, maximize=False, muon_mode="exact", threads=0, master_weights=True,
                 stochastic_rounding=False, seed=0, process_group=None, grad_reduce="replicated"):
        # torch's constructor checks first, in its order and with its texts.
        if isinstance(lr, torch.Tensor) and lr.numel() != 1:
            raise ValueError("Tensor lr must be 1-element")
        if not 0.0 <= lr:
            raise ValueError("Learning rate should be >= 0 but is: %s" % (lr,))
        if not 0.0 <= momentum:
            raise ValueError("momentum should be >= 0 but is: %s" % (momentum,))
        if not 0.0 <= weight_decay:
            raise ValueError("weight decay should be >= 0 but is: %s" % (weight_decay,))
        if adjust_lr_fn is not None and adjust_lr_fn not in ("original", "match_rms_adamw"):
            raise ValueError("Adjust learning rate function %s is not supported" % (adjust_lr_fn,))
        _muon_mode(muon_mode)
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                        ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn,
                        max_grad_norm=max_grad_norm, maximize=maximize, muon_mode=muon_mode)
        super().__init__(params, defaults, threads, master_weights, stochastic_rounding, seed,
                         process_group, grad_reduce)

    def _core_config(self, group):
        _muon_matrices(group, "Muon", two_d=True)
        hyper = _muon_hyper(_muon_number("Learning rate", "lr", group["lr"], tensor=True),
                            _muon_number("weight decay", "weight_decay", group["weight_decay"]),
                            _muon_number("momentum", "momentum", group["momentum"]), group["nesterov"],
                            group["ns_coefficients"], group["eps"], group["ns_steps"], group["adjust_lr_fn"],
                            group.get("muon_mode", self.defaults["muon_mode"]))
        return "muon", _clip(group, hyper, "Muon")


# SingleDeviceMuonWithAuxAdam's group keys and defaults (Keller Jordan's Muon package, muon.py).
_MUON_GROUP_DEFAULTS = {"lr": 0.02, "momentum": 0.95, "weight_decay": 0}
_AUX_GROUP_DEFAULTS = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-10, "weight_decay": 0}
_SHARED_GROUP_KEYS = ("params", "param_names", "use_muon", "max_grad_norm", "maximize", "muon_mode")


class MuonWithAuxAdam(_Base):
    """The Muon package's SingleDeviceMuonWithAuxAdam: every param group says use_muon=True
    (Muon on its matrices: lr 0.02, momentum 0.95, weight_decay 0 by default) or use_muon=False
    (an auxiliary AdamW: lr 3e-4, betas (0.9, 0.95), eps 1e-10, weight_decay 0), all in ONE step
    of ONE core Task (kind muon: the Muon groups' parameters in its weight group, the aux groups'
    in its bias-like group) where their dtype, max_grad_norm and device agree.

    The math is torch.optim.Muon's (docs/math.md, "Muon"), which the issue asks for, not the
    package's own where they differ: Nesterov on, 5 Newton–Schulz steps, X / max(||u||_F, 1e-7)
    (the package: X / (||u||_F + 1e-7)), and the lr adjusted by sqrt(max(1, A / B)) of the matrix
    (shape[0], prod(rest)) a tensor is viewed as (the package scales a conv weight's update by its
    last two dims). The aux groups run torch's AdamW with torch's Adam bias corrections. A
    parameter whose .grad is None is not stepped (the package steps it with a zero gradient).
    A use_muon=False group's weight_decay is AdamW's decoupled decay with that group's lr.
    Deviations: a group with another key is a ValueError (the package asserts its key sets).
    muon_mode (this package's, keyword-only, fixed at construction, one for every group): "exact"
    (default) or "fast", as Muon's. process_group= and grad_reduce= as every class (a matrix's
    momentum lives whole on its owner rank, the aux groups' state in slices); there the groups
    share Tasks as in one process, so max_grad_norm and the non-finite check act on them alike."""

    _implementation = "_multi_tensor_muon_with_aux_adam"
    # The Task's families: the aux groups' AdamW state (the kind's bias-like group); a Muon group's
    # (the kind's weight group) is its momentum_buffer alone.
    _state_names = _torch_state("muon", group="bias_like")
    _required_keys = ("use_muon",)
    _group_keys = ("use_muon", "lr", "momentum", "weight_decay", "betas", "eps", "max_grad_norm", "maximize",
                   "muon_mode")

    def __init__(self, param_groups, *, max_grad_norm=None, maximize=False, muon_mode="exact", threads=0,
                 master_weights=True, stochastic_rounding=False, seed=0, process_group=None, grad_reduce="replicated"):
        _muon_mode(muon_mode)
        super().__init__(param_groups, dict(max_grad_norm=max_grad_norm, maximize=maximize, muon_mode=muon_mode),
                         threads, master_weights, stochastic_rounding, seed, process_group, grad_reduce)

    def add_param_group(self, param_group):
        """A group says use_muon=True or use_muon=False; the package's defaults fill its other keys."""
        if isinstance(param_group, dict):
            param_group = dict(param_group)
            if "use_muon" not in param_group:
                raise ValueError("MuonWithAuxAdam: every param group says use_muon=True (Muon) or use_muon=False "
                                 "(the auxiliary AdamW); param group %d has no use_muon" % len(self.param_groups))
            use = param_group["use_muon"]
            if not isinstance(use, bool):
                raise ValueError("MuonWithAuxAdam: use_muon=%r: expected True or False" % (use,))
            own = _MUON_GROUP_DEFAULTS if use else _AUX_GROUP_DEFAULTS
            unknown = sorted(set(param_group) - set(own) - set(_SHARED_GROUP_KEYS))
            if unknown:
                raise ValueError("MuonWithAuxAdam: a use_muon=%s group takes %s; got %s" % (
                    use, ", ".join(own), ", ".join(map(repr, unknown))))
            for k, v in own.items():
                param_group.setdefault(k, v)
        super().add_param_group(param_group)

    def _roles(self, group):
        return ["fc_weight" if group["use_muon"] else "fc_bias"] * len(group["params"])

    def _state_names_for(self, group):
        return _torch_state("muon", group="weight" if group["use_muon"] else "bias_like")

    def _task_state_names(self, group):
        return self._state_names

    def _core_config(self, group):
        use = group["use_muon"]
        if not isinstance(use, bool):
            raise ValueError("MuonWithAuxAdam: use_muon=%r: expected True or False" % (use,))
        if use:
            _muon_matrices(group, "MuonWithAuxAdam", two_d=False)
            hyper = _muon_hyper(_muon_number("Learning rate", "lr", group["lr"], tensor=True),
                                _muon_number("weight decay", "weight_decay", group["weight_decay"]),
                                _muon_number("momentum", "momentum", group["momentum"]),
                                muon_mode=group.get("muon_mode", self.defaults["muon_mode"]))
        else:
            b1, b2 = _betas(group)
            lr = _lr(group)
            wd = _weight_decay(group)
            # The kind's bias-like group reads its lr and its decoupled weight decay from aux_lr and
            # aux_weight_decay (lr and weight_decay are the Muon groups').
            hyper = {"lr": lr, "aux_lr": lr, "beta1": b1, "beta2": b2,
                     "eps": _at_least_zero("Invalid epsilon value", "eps", group["eps"]), "weight_decay": 0.0,
                     "aux_weight_decay": wd, "adjust_lr": 0,
                     "muon_mode": _muon_mode(group.get("muon_mode", self.defaults["muon_mode"]))}
        return "muon", _clip(group, hyper, "MuonWithAuxAdam")


_CLASSES = (SGD, Adam, AdamW, LARS, Lion, LAMB, Muon, MuonWithAuxAdam)
# Every class's group keys: a key in here that this class's groups lack marks another class's dict.
_ALL_GROUP_KEYS = frozenset(k for c in _CLASSES for k in c._group_keys)

# The replay recorder (renaissance/recorder.py) under its public name:
# renaissance.torch.Recorder(opt, case_dir, steps=N).
from .recorder import Recorder  # noqa: E402  (recorder imports nothing from this module)
