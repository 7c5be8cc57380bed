"""Torch param groups bound to renaissance Tasks (used by renaissance.torch).

The groups of one optimizer that share a compiled step (kind, weight-decay mode, clipping) share
ONE core Task (SharedTask): each torch group is a hyperparameter group of it (its own block of
scalar slots), so step() is one core step whatever the number of groups, and a group's lr or
betas change without re-capture. The parameters' .data and .grad are re-pointed to views into
the Task's W and G regions (DLPack tensors that keep the Task alive); .grad only for a parameter
that has a gradient (torch's rule: a parameter backward never reached has none and is not
stepped), so autograd accumulates straight into the arena where .grad is the view.
GroupBinding is the per-torch-group face of a SharedTask.

A parameter whose .grad is None at step() is skipped as torch skips it: the Task is built with the
core's per-tensor mask (TaskOptions::tensor_mask) and step() writes the mask from `p.grad is None`
(one small host-to-device copy, only when the pattern changed; no sync): the device leaves its W
and state alone, keeps its gradient out of the non-finite check and does not advance its own step
count, so its later Adam bias corrections use its own count as torch's per-parameter `step` does.
Clipping included (the clip norm reads a masked tensor's G as zeros). Under a torch.distributed
process group the sharded step runs the same mask (every rank must leave out the same
parameters), so each parameter keeps its own count there too.

Gradients autograd allocated itself (after zero_grad(set_to_none=True), torch 2.x's default) are
read where they are: the Task is built with the core's gradient table
(TaskOptions::gradient_table), one address per parameter that the compiled step reads on the
device at run time, and step() writes the table from the `.grad` tensors (one small host-to-device
copy, only when an address changed; no sync, no re-capture). No copy into G, no zeroing; `.grad`
stays autograd's tensor. A `.grad` the step cannot read in place (another dtype or device, not
contiguous) is copied into G and re-pointed to its view, as before. Under a process group the
sharded step reduces gradients in G: there the Task has no table and every foreign `.grad` is
copied in.

Complex parameters (complex64), as torch's optimizers treat them (torch.view_as_real): the arena
holds the real view, shape + (2,) float32, and the step updates the real and imaginary parts as
two real elements. The parameter stays complex to the user: .data and .grad are
torch.view_as_complex of the W and G views (pW, pG), and so are its state tensors (exp_avg, ...),
which is what torch's state holds for a complex parameter. A complex gradient autograd allocated
is read in place through its real view.

bf16/fp16 parameters: the Task keeps fp32 masters in W and a model copy C in the
parameters' dtype, written by every applied step from the new masters (rounded to nearest even or
stochastically), and its gradients in the model dtype (PrecisionOptions::model_dtype_gradients).
.data is the view of C and .grad (where it is the view) the view of G, both in the parameter's dtype, so the forward and
backward run on the copy and the step reads the gradients where autograd wrote them. The masters
are torch state under 'master_weight'. The core mask takes model-dtype gradients: a None gradient
leaves the master, the state and C as they were, and the parameter's own count. Without master
weights (master_weights=False) each step first sets every master to its parameter widened
(exact), so the update starts from the bf16/fp16 weights alone; W is then scratch between steps.
"""
import gc
import warnings

import torch

from . import _core

_GRAD_COPY_WARNED = [False]  # warn once per process that a foreign .grad was copied in


def arena_text(params, precision, state_names, device):
    """What an arena that could not be allocated holds per element, for the error: the float32
    masters (W), the state families and the gradient (G) and, for bf16/fp16 parameters, the model
    copy (C) and model-dtype gradients; torch.optim keeps its state in the parameter's dtype."""
    elements = sum(p.numel() * (2 if p.is_complex() else 1) for p in params)
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in params})
    parts = [("float32 master weights" if precision != "fp32" else "float32 weights", 4)]
    parts += [(state_names[fam], 4) for fam in ("M", "V", "VMAX") if fam in state_names]
    if precision != "fp32":
        parts += [("the %s copy" % dtypes[0], 2), ("the %s gradient" % dtypes[0], 2)]
    else:
        parts += [("the gradient", 4)]
    per = sum(b for _, b in parts)
    text = ("renaissance.torch: %d elements of %s parameters take %d bytes each in the arena (%s)" %
            (elements, "/".join(dtypes), per, ", ".join("%s %d" % pb for pb in parts)))
    if precision != "fp32":
        text += ("; the state is float32 for %s parameters (torch.optim keeps it in the parameter's dtype: "
                 "%d bytes each)" % (dtypes[0], 2 * (2 + sum(1 for f in ("M", "V", "VMAX") if f in state_names))))
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        text += "; %d of %d bytes free on %s" % (free, total, device)
    return text


def tensor_interval(p):
    """The byte range [start, end) a non-empty tensor's elements span (strided: from its first to
    its last element, gaps included)."""
    start = p.data_ptr()
    last = sum((n - 1) * st for n, st in zip(p.shape, p.stride()))
    return start, start + (last + 1) * p.element_size()


# The hyperparameters every group of one core Task holds alike (the table's task-wide rows:
# max_grad_norm), in table order.
TASK_WIDE = tuple(h["name"] for h in _core.hyperparameters() if h["task_wide"])


def structure_key(kind, hyper, device):
    """What must agree for torch groups to share one Task (the compiled step's shape)."""
    return (kind, hyper.get("weight_decay_mode")) + tuple(hyper.get(n) for n in TASK_WIDE) + (device,)


class SharedTask:
    """One core Task for several torch groups: members[h] = (params, roles, hyper) of group h."""

    def __init__(self, members, kind, device, threads, state_names, precision="fp32", rounding="nearest", seed=0,
                 sharded=False, state_shard=None, master_weights=True):
        self.kind = kind
        self.device = device
        self.precision = precision
        # master_weights=False (bf16/fp16): each step first sets the masters from the parameters.
        self.masters_from_params_each_step = precision != "fp32" and not master_weights
        if precision != "fp32":
            state_names = dict(state_names, W="master_weight")  # the fp32 masters are state too
        self.state_names = state_names  # {"M": "exp_avg", ...}: families kept as torch state
        self.amp_used = False
        self.params = [p for params, _, _ in members for p in params]
        backend = "cuda" if device.type == "cuda" else "cpu"
        self.device_id = device.index if device.type == "cuda" else 0
        specs, groups = [], []
        for h, (params, roles, _) in enumerate(members):
            for p, role in zip(params, roles):
                # A complex parameter: its real view's shape (the arena is real).
                specs.append((str(len(specs)), [int(d) for d in p.shape] + ([2] if p.is_complex() else []), role))
                groups.append(h)
        self.complex_ids = [j for j, p in enumerate(self.params) if p.is_complex()]
        # zero_grad(set_to_none=True) ran: .grad tensors are autograd's, copying them in is expected
        # (no warning). Without the gradient table (a sharded step) that holds from construction
        # too: a parameter without a .grad then gets autograd's tensor at its first backward.
        self.grads_released = bool(sharded)
        self.sharded = None  # the sharded step over a process group (_torch_dist.attach)
        # (rank, K) under a process group: the arena holds M and V for this rank's slice only
        # (TaskOptions::state_shard); they have no per-parameter views, the sharded step's
        # collective reads and the Task's sliced writes stand in (renaissance/torch.py).
        self.sliced = state_shard is not None
        # The gradient table on single-device Tasks (a sharded step reduces gradients in G).
        self.use_table = not sharded
        def build():
            with _device_context(device):
                task = _core.Task(specs, backend=backend, threads=threads, check_finite=True, groups=groups,
                                  tensor_mask=True, precision=precision, rounding=rounding, seed=seed,
                                  model_dtype_gradients=precision != "fp32",
                                  state_shard=list(state_shard) if self.sliced else [], gradient_table=self.use_table)
                task.optimizer_groups(kind, [dict(hyper) for _, _, hyper in members])
                task.compile()
            return task
        try:
            task = build()
        except RuntimeError as e:
            # An optimizer that was dropped keeps its arena until Python's cyclic collector runs
            # (its Tasks and bindings refer to each other), and torch's caching allocator keeps
            # freed blocks: both released, the allocation is tried once more.
            if "cannot allocate an arena" not in str(e):
                raise
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            try:
                task = build()
            except RuntimeError as e2:
                if "cannot allocate an arena" not in str(e2):
                    raise
                raise RuntimeError("%s; %s" % (e2, arena_text(self.params, precision, state_names, device))) from None
        self.task = task
        did = self.device_id
        n = len(self.params)
        self.W = [task.view("W", j, did) for j in range(n)]  # fp32 (the masters with a model copy)
        # The model copy (bf16/fp16 parameters): what .data views; None for fp32.
        # An encoding torch's DLPack has no dtype for (all but bf16 and fp16) comes as the unsigned
        # integer of its bytes: reinterpreted as the parameter's dtype (the precision table's torch dtype).
        def as_param(view, j):
            return view if precision == "fp32" or view.dtype == self.params[j].dtype else view.view(self.params[j].dtype)
        self.C = [as_param(task.view("C", j, did), j) for j in range(n)] if precision != "fp32" else None
        self.G = [as_param(task.view("G", j, did), j) for j in range(n)]
        # What .data and .grad become: the W (or C) and G views, complex views of them for a
        # complex parameter.
        self.pW, self.pG = list(self.weights), list(self.G)
        for j in self.complex_ids:
            self.pW[j] = torch.view_as_complex(self.W[j])
            self.pG[j] = torch.view_as_complex(self.G[j])
        for j, p in enumerate(self.params):  # the views .data and .grad become must keep the dtype
            if self.pW[j].dtype != p.dtype or self.pG[j].dtype != p.dtype:
                raise RuntimeError("renaissance.torch: the Task's views are %s/%s for a %s parameter (a build "
                                   "mismatch)" % (self.pW[j].dtype, self.pG[j].dtype, p.dtype))
        self.M = [task.view("M", j, did) for j in range(n)] if "M" in state_names and not self.sliced else None
        self.V = [task.view("V", j, did) for j in range(n)] if "V" in state_names and not self.sliced else None
        # amsgrad: torch's max_exp_avg_sq (a sliced task holds its slice, as of V).
        self.VMAX = [task.view("VMAX", j, did) for j in range(n)] if "VMAX" in state_names and not self.sliced else None
        self.g_ptrs = tuple(g.data_ptr() for g in self.G)
        # What a .grad read in place must match (readable): one dtype and device per Task; an
        # empty tensor goes through the copy path (its data_ptr may be null).
        self.g_dtype = self.G[0].dtype if self.G else None
        self.g_device = self.G[0].device if self.G else None
        self.g_numel = [g.numel() if g.numel() > 0 else -1 for g in self.G]
        self.G_all = task.family_view("G", did)
        if n > 0 and self.G_all.dtype != self.G[0].dtype:
            self.G_all = self.G_all.view(self.G[0].dtype)
        self.inv_scale = task.scalar_view("inv_loss_scale", did)  # one slot per scalar block (strided)
        # The hyperparameter group of each scalar block (a block per parameter: the per-tensor
        # mask), for the sign a maximizing group's 1/scale slot carries (set_scale).
        self.block_groups = groups or [0]
        self.scale_signs = None  # (maximize flag per group, the device tensor of block signs)
        # Every Task runs with the per-tensor mask: every kind, precision and clipping (the clip
        # norm leaves masked tensors out, as clip_grad_norm_ does parameters without a .grad), and
        # under a sharded step (_torch_dist.py) too, where every rank writes the same mask
        # (_torch_dist.agree_step).
        self.mask = task.scalar_view("tensor_mask", did)
        self.mask_written = ()  # the missing ids the device's mask holds (the arena starts at 0)
        # The gradient table (int64 addresses) and what it holds: compile() wrote the G views'.
        self.table = task.scalar_view("gradient_table", did) if self.use_table else None
        self.table_written = self.g_ptrs
        self.in_place_steps = 0  # steps that read at least one .grad in place (tests look)
        self.bindings = []
        # Where each parameter's .data must point (its view of W or C): step() compares, and
        # follows a `p.data = tensor` by copying the new values in (follow_data).
        self.w_ptrs = [w.data_ptr() for w in self.weights]
        # Ids of parameters whose group was removed from param_groups: masked at every step, as
        # torch no longer steps them.
        self.dropped = frozenset()

    def is_view(self, j, g):
        # The common case first: torch hands back the very tensor object it was given. Otherwise
        # (torch only accepts a .grad of the parameter's shape) the address and layout decide.
        return g is self.G[j] or (g.data_ptr() == self.g_ptrs[j] and g.is_contiguous())

    @property
    def weights(self):
        """The views .data points at: W, or the model copy C for bf16/fp16 parameters."""
        return self.W if self.C is None else self.C

    def adopt(self):
        """Copies every parameter (and any gradient) in, then re-points .data and .grad. A bf16/
        fp16 parameter becomes its copy bit for bit, its master the same value widened (exact)."""
        with torch.no_grad():
            for j, p in enumerate(self.params):
                self.W[j].copy_(_real(p.detach()))
                if self.C is not None:
                    self.C[j].copy_(p.detach())
                if p.grad is not None:
                    self.G[j].copy_(_real(p.grad.detach()))
            for j, p in enumerate(self.params):
                p.data = self.pW[j]
                # Only a parameter that came with a gradient gets the view (its values copied in
                # above). Every other .grad stays None, as torch leaves it until backward reaches
                # the parameter: a parameter backward never reaches (an unused layer, a frozen
                # one) is masked at every step and gets no state, as torch never steps it. A
                # gradient backward hands over later is read in place (the gradient table) or
                # copied in (collect_missing).
                if p.grad is not None:
                    p.grad = self.pG[j]

    def moved(self):
        """The ids whose .data no longer is the arena's view (`p.data = tensor`, another optimizer
        built over the same parameters); one data_ptr per parameter, compared as a list."""
        ptrs = [p.data_ptr() for p in self.params]
        if ptrs == self.w_ptrs:
            return []
        return [j for j, (a, b) in enumerate(zip(ptrs, self.w_ptrs)) if a != b and j not in self.dropped]

    def follow_data(self, ids):
        """Copies each moved parameter's current values into the arena (a bf16/fp16 one: the copy,
        and its master widened from it, as the new weights), then points .data back at the view.
        The caller checked shape, dtype and device (torch steps whatever .data holds now)."""
        with torch.no_grad():
            for j in ids:
                p = self.params[j]
                self.weights[j].copy_(p.data)
                if self.C is not None:
                    self.W[j].copy_(self.C[j])
                p.data = self.weights[j]

    def masters_from_params(self, ids=None):
        """bf16/fp16: each master (W) set to its parameter's current value, widened exactly (all
        of them, ids None: one multi-tensor copy where torch has torch._foreach_copy_)."""
        with torch.no_grad():
            if ids is None and hasattr(torch, "_foreach_copy_"):
                torch._foreach_copy_(self.W, self.C)
                return
            for j in range(len(self.params)) if ids is None else ids:
                self.W[j].copy_(self.C[j])

    def zero_grad(self, set_to_none):
        self.grads_released = set_to_none  # step() then expects autograd's tensors: no warning
        if set_to_none:
            for j, p in enumerate(self.params):
                if j not in self.dropped:  # torch leaves parameters outside param_groups alone
                    p.grad = None
            return
        with torch.no_grad():
            self.G_all.zero_()
        for j, (p, g) in enumerate(zip(self.params, self.pG)):
            grad = p.grad
            if grad is None:
                continue  # torch zeroes the gradients there are; a None one stays None (not stepped)
            if grad is not g and not self.is_view(j, grad):
                p.grad = g

    def set_scale(self, grad_scale):
        """The step's 1/scale slots: from torch's scale tensor on the device (no host sync), or 1."""
        if grad_scale is not None:
            # 1/s formed in double, rounded to float once: Task.set_loss_scale's bits; copy_
            # broadcasts it into every group's slot.
            inv = grad_scale.detach().to(self.inv_scale.device).double().reciprocal().float()
            signs = self.block_signs()
            # A maximizing group's blocks hold -1/s (Task.set_loss_scale's bits for it: the
            # negation is exact), so the step reads -g there (docs/math.md, "maximize").
            self.inv_scale.copy_(inv.reshape(1) if signs is None else inv.reshape(1) * signs)
            self.amp_used = True
        elif self.amp_used:
            self.task.set_loss_scale(1.0)
            self.amp_used = False

    def block_signs(self):
        """None when no group maximizes, else a float32 tensor on the device of +1/-1 per scalar
        block (its group's maximize), rebuilt only when a group's maximize changed."""
        flags = tuple(bool(b.hyper.get("maximize")) for b in sorted(self.bindings, key=lambda b: b.index))
        if not any(flags):
            return None
        if self.scale_signs is None or self.scale_signs[0] != flags:
            host = torch.tensor([-1.0 if flags[h] else 1.0 for h in self.block_groups], dtype=torch.float32)
            self.scale_signs = (flags, host.to(self.inv_scale.device))
        return self.scale_signs[1]

    def readable(self, j, g):
        """Whether the step can read gradient g of parameter j in place through the table: G's
        dtype and device, dense and contiguous, the parameter's numel (cheap checks first: this
        runs per parameter per step)."""
        return (g.dtype is self.g_dtype and g.numel() == self.g_numel[j] and g.layout is torch.strided
                and g.device == self.g_device and g.is_contiguous())

    def step(self, grad_scale):
        """One core step for every group. Returns False when no parameter has a gradient.
        Without master weights the masters are first set from the parameters (the step then
        starts from the model-dtype weights alone). Under a process group the optimizer runs the
        two halves itself, with one collective for all its Tasks between them (_torch_dist.agree_step)."""
        return self.finish_step(self.collect_missing(), grad_scale)

    def collect_missing(self):
        """The ids of the parameters without a gradient this step (masked); gradients the step
        cannot read in place are copied in (and the table's addresses noted for finish_step)."""
        missing = []
        foreign = []  # ids whose .grad is a tensor of autograd's, not our view: copied in below
        # The table: each parameter's gradient address. The G view's for a view, a missing
        # gradient (masked: never read for the update, but a valid address whatever reads) and
        # a copied-in one; the tensor's own for a .grad read in place.
        ptrs = list(self.g_ptrs) if self.use_table else None
        G, use_table, cplx, dropped = self.pG, self.use_table, bool(self.complex_ids), self.dropped
        for j, p in enumerate(self.params):
            g = p.grad
            # A removed group: masked, never updated. requires_grad is not looked at: as torch, a
            # parameter is stepped iff its .grad is not None (a frozen one given a .grad included).
            if dropped and j in dropped:
                missing.append(j)
                continue
            if g is G[j]:
                continue
            if g is None:
                missing.append(j)
                continue
            if cplx and g.is_complex():
                g = torch.view_as_real(g)  # what the step reads (the same memory)
            if use_table and self.readable(j, g):
                ptrs[j] = g.data_ptr()  # the view's own address when g is (a copy of) the view
            elif not self.is_view(j, g):
                foreign.append(j)
        if foreign:
            if not self.grads_released and not _GRAD_COPY_WARNED[0]:
                _GRAD_COPY_WARNED[0] = True
                warnings.warn("renaissance.torch: a parameter's .grad is not the optimizer's gradient view; "
                              "it is copied in and .grad re-pointed (one extra copy; see docs/python.md)",
                              stacklevel=3)
            self.copy_in(foreign)
        self.pending_ptrs = ptrs
        return missing

    def finish_step(self, missing, grad_scale):
        """The step itself, after collect_missing (and, under a process group, after every rank
        agreed on the mask and the configuration)."""
        ptrs, self.pending_ptrs = self.pending_ptrs, None
        if len(missing) == len(self.params):
            return False
        self.set_scale(grad_scale)
        if self.masters_from_params_each_step:
            self.masters_from_params()
        self.write_mask(tuple(missing))
        if self.use_table:
            self.write_table(tuple(ptrs))
        # A .grad read in place stays autograd's tensor (not re-pointed to the view). It lives at
        # least until the step has read it: p.grad holds it until the next zero_grad or backward,
        # and once released, torch's caching allocator hands its block out again only to work
        # ordered after the step on the stream it was freed on (the current stream, which the step
        # runs on). On the CPU the step has finished when step() returns.
        self.run_step()
        return True

    def write_table(self, ptrs):
        """The device's gradient table from the addresses: one copy, only when one changed. As
        write_mask: on CUDA from pinned memory without blocking, on torch's current stream (the
        step's), so it lands before the step reads it; no host sync, no re-capture."""
        if ptrs != self.table_written:
            host = torch.tensor(ptrs, dtype=torch.int64)
            with torch.no_grad():
                if self.device.type == "cuda":
                    self.table.copy_(host.pin_memory(), non_blocking=True)
                else:
                    self.table.copy_(host)
            self.table_written = ptrs
        if ptrs != self.g_ptrs:
            self.in_place_steps += 1

    def copy_in(self, ids):
        """Gradients the step cannot read in place (without the gradient table: any tensor
        autograd allocated itself, e.g. after zero_grad(set_to_none=True)) into the arena's G,
        then .grad re-pointed to the view. One multi-tensor copy where torch has
        torch._foreach_copy_ (2.1+): a copy_ per tensor is a launch per tensor, which on the H200
        cost resnet50 0.4 ms a step (bench_torch_step.py --phases)."""
        dst = [self.G[j] for j in ids]
        src = [_real(self.params[j].grad.detach()) for j in ids]
        with torch.no_grad():
            if hasattr(torch, "_foreach_copy_"):
                torch._foreach_copy_(dst, src)
            else:
                for d, g in zip(dst, src):
                    d.copy_(g)
        for j in ids:
            self.params[j].grad = self.pG[j]

    def run_step(self):
        if self.device.type == "cuda":
            self.task.set_stream(torch.cuda.current_stream(self.device).cuda_stream)
        with _device_context(self.device):  # the Task's device, whichever is current
            (self.task if self.sharded is None else self.sharded).step()

    def write_mask(self, missing):
        """The device mask from the ids without a gradient: one copy, only when it changed. On
        CUDA from pinned memory without blocking, on torch's current stream (the step's stream),
        so it lands before the step reads it; torch keeps the pinned buffer until the copy ran."""
        if missing == self.mask_written:
            return
        host = torch.zeros(len(self.params), dtype=torch.int32)
        if missing:
            host[list(missing)] = 1
        with torch.no_grad():
            if self.device.type == "cuda":
                self.mask.copy_(host.pin_memory(), non_blocking=True)
            else:
                self.mask.copy_(host)
        # The Task runs its unmasked program (the speed of a Task without the mask) while it
        # knows that no entry is set and every parameter's count equals its own.
        self.task.tensor_mask_written(bool(missing))
        self.mask_written = missing

    def flush_lrs(self):
        """Every group's lr in one host-to-device copy (an lr schedule over many groups)."""
        self.task.set_group_lrs([b.hyper["lr"] for b in self.bindings])

    def reapply_hyper(self):
        """Every group's scalars from the hyperparameters last applied (after a checkpoint load)."""
        self.task.optimizer_groups(self.kind, [dict(b.hyper) for b in self.bindings])


def _task_property(name):
    """A read-only property of GroupTask: the shared core Task's attribute `name`."""
    return property(lambda self: getattr(self.shared, name), doc="The shared core Task's %s." % name)


class GroupTask:
    """What a one-group Task offered per torch group, over the group's slice of a SharedTask:
    its parameters, lr, loss scale, step counts and fingerprint (the fingerprint a Task holding
    only this group would print: renaissance.torch.Recorder and fingerprint() use it)."""

    def __init__(self, binding):
        self._b = binding

    @property
    def shared(self):
        return self._b.shared.task

    @property
    def params(self):
        """(name, shape, role) of the group's parameters, named 0.. within the group (as a Task
        of this group alone would name them)."""
        everything = self.shared.params
        return [(str(j),) + tuple(everything[i][1:]) for j, i in enumerate(self._b.ids)]

    @property
    def lr(self):
        return self._b.hyper["lr"]

    # What the shared core Task holds for all its groups, read from it.
    loss_scale = _task_property("loss_scale")
    step_count = _task_property("step_count")
    skipped_steps = _task_property("skipped_steps")
    backend = _task_property("backend")
    precision = _task_property("precision")
    rounding = _task_property("rounding")
    seed = _task_property("seed")
    grad_dtype = _task_property("grad_dtype")

    def fingerprint(self):
        s = self._b.shared
        if s.sliced:  # a collective: every rank asks for the same groups in the same order
            return s.sharded.fingerprint_of(self._b.ids)
        return self.shared.fingerprint_of(self._b.ids)

    def get_weight(self, j):
        return self.shared.get_weight(self._b.ids[j])

    def get_grad(self, j):
        return self.shared.get_grad(self._b.ids[j])

    def set_loss_scale(self, scale):
        """Task-wide: every group of the shared Task."""
        self.shared.set_loss_scale(scale)

    def config(self):
        return _core._task_config(self.shared, self._b.index)

    def families(self):
        return _core._task_families(self.shared)

    def read(self, family, name):
        """A host copy of the group's parameter `name` (its index in the group, as text)."""
        return _core._task_read(self.shared, family, self._b.ids[int(name)])

    def read_encoded(self, family, name):
        """Host encodings (numpy uint16; uint8 for a 1-byte encoding) of the group's parameter `name`:
        "C" its model copy, "G" its model-dtype gradient."""
        j = self._b.ids[int(name)]
        return self.shared.get_model_copy(j) if family == "C" else self.shared.get_grad_encoded(j)


class GroupBinding:
    """One torch param group: hyperparameter group `index` of a SharedTask, its parameters the
    SharedTask's `ids` (in order), with per-parameter views W, G, M, V."""

    def __init__(self, shared, index, first, params, roles, hyper):
        self.shared = shared
        self.index = index
        self.params = list(params)
        self.ids = list(range(first, first + len(self.params)))
        self.names = [str(j) for j in range(len(self.params))]  # as GroupTask names them
        self.kind = shared.kind
        self.roles = list(roles)
        self.hyper = dict(hyper)  # the core hyperparameters last applied (lr included)
        self.state_names = shared.state_names
        self.device = shared.device
        sl = slice(first, first + len(self.params))
        self.W = shared.W[sl]
        self.C = shared.C[sl] if shared.C is not None else None
        self.G = shared.G[sl]
        self.M = shared.M[sl] if shared.M is not None else None
        self.V = shared.V[sl] if shared.V is not None else None
        self.VMAX = shared.VMAX[sl] if shared.VMAX is not None else None
        self.task = GroupTask(self)
        shared.bindings.append(self)

    @property
    def inv_scale(self):
        return self.shared.inv_scale

    def set_scale(self, grad_scale):
        self.shared.set_scale(grad_scale)

    def check_hyper(self, kind, hyper):
        """A ValueError when `hyper` needs another compiled step than this group's (changes nothing)."""
        if kind != self.kind:
            raise ValueError(
                "cannot change the optimizer of a param group from '%s' to '%s' after construction "
                "(momentum to or from 0, nesterov or decoupled_weight_decay change the compiled step); "
                "build a new optimizer" % (self.kind, kind))
        if hyper.get("amsgrad", False) != self.hyper.get("amsgrad", False):
            raise ValueError("cannot change amsgrad after construction (it adds a state buffer, one setting per "
                             "compiled step); build a new optimizer")
        if hyper.get("max_grad_norm") != self.hyper.get("max_grad_norm"):
            raise ValueError("cannot change max_grad_norm after construction (clipping is one setting per compiled "
                             "step, shared by the groups of one task)")
        if hyper.get("adjust_lr") != self.hyper.get("adjust_lr"):
            raise ValueError("cannot change adjust_lr_fn after construction (Muon's lr adjustment is planned per "
                             "matrix when the step is compiled); build a new optimizer")
        if hyper.get("muon_mode") != self.hyper.get("muon_mode"):
            raise ValueError("cannot change muon_mode after construction (Newton-Schulz's products are chosen when "
                             "the step is compiled); build a new optimizer")
        if hyper != self.hyper:  # the core's own range rules (the kinds without a torch counterpart)
            self.shared.task.check_hyper(kind, **hyper)

    def apply_hyper(self, kind, hyper, lr_batch=None):
        """Brings this group's scalar block to `hyper` (no recompile): lr alone, else all. With
        `lr_batch` (a dict) an lr-only change is only recorded there (id(shared) -> shared): the
        caller then writes every group's lr of that Task in one copy (flush_lrs)."""
        self.check_hyper(kind, hyper)
        if hyper == self.hyper:
            return
        changed = {k for k in hyper if hyper[k] != self.hyper.get(k)}
        if changed == {"lr"} and lr_batch is not None:
            lr_batch[id(self.shared)] = self.shared
        elif changed == {"lr"}:
            self.shared.task.set_group_lr(self.index, hyper["lr"])
        else:
            self.shared.task.set_group_hyper(self.index, kind, **hyper)
        self.hyper = dict(hyper)

    def state_of(self, j, step_tensor):
        st = {}
        if "step" in self.state_names:
            st["step"] = step_tensor
        for fam, bufs in (("W", self.W), ("M", self.M), ("V", self.V), ("VMAX", self.VMAX)):
            if bufs is not None and fam in self.state_names:
                # A complex parameter's state is complex, as torch keeps it (the arena's real view).
                st[self.state_names[fam]] = torch.view_as_complex(bufs[j]) if self.params[j].is_complex() else bufs[j]
        return st


def _real(t):
    """A complex tensor's real view (shape + (2,)); any other tensor as it is."""
    return torch.view_as_real(t) if t.is_complex() else t


class _device_context:
    """torch.cuda.device(d) for a CUDA device (the Task allocates on the current device)."""

    def __init__(self, device):
        self.ctx = torch.cuda.device(device) if device.type == "cuda" else None

    def __enter__(self):
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *exc):
        if self.ctx is not None:
            return self.ctx.__exit__(*exc)
        return False
