"""renaissance.torch over a torch.distributed process group (docs/distributed.md,
"torch.distributed", and docs/python.md).

The core's ShardedStep does the arithmetic: the partition of every family over the K ranks (a
pure function of the plan and K), the rank-order fp32 sum of the `ordered` gradients, the
canonical combination of the per-tile norm partials, the slice's update. This module only gives
it a Communicator: TorchCommunicator runs each collective with torch.distributed on views of the
buffers the core passes (renaissance._core._raw_view), so any backend torch has (gloo on the CPU,
NCCL on GPUs) moves the bytes, and none of them adds anything up: `ordered` never uses torch's
all_reduce, whose order is the backend's.
"""
import atexit
import collections
import ctypes
import hashlib
import json
import weakref

import torch
import torch.distributed as dist

from . import _core

GRAD_REDUCE = ("replicated", "ordered", "fast")

# What this package hands to torch.distributed lives as long as the communicator that lent it, and
# from interpreter exit on for good (never freed). Why: gloo runs a collective on one of its worker
# threads, which lets go of the finished work, and with it of the work's tensors, some time after
# wait() has returned (a worker descheduled there may lag any number of later collectives, which
# the group's other worker runs). When that thread drops the last reference to a tensor whose
# Python object has gone already, torch frees the Python object from that thread
# (TensorImpl::destroy_pyobj_if_needed takes the GIL); an arena view also calls into Python when
# freed (nanobind's DLPack deleter). A thread that asks for the GIL after the interpreter has begun
# to finalize is ended by pthread_exit, whose unwinding through torch's noexcept destructor is
# std::terminate: "terminate called without an active exception", status 134. Its window is the
# exit of a script that never calls destroy_process_group, or calls it while this optimizer still
# holds the group (so that its worker threads are not joined).
#
# So nothing lent is made per call and dropped: a communicator lends only views it caches by
# (address, bytes, device, dtype) of memory that lives as long as it does (TorchCommunicator._owned:
# the task's arena, the workspace, the sum buffer; the regions the core passes there are a fixed
# set per Task); a buffer of the caller's (read_state's host destination, at another address each
# call) moves through the communicator's stage, whose views are cached the same way. The small
# collectives (the step's flags and digest, the handshake's words, save()'s flag, the Recorder's
# gathers) use buffers reused per (group, role, dtype, length rounded up to a power of two). gloo's
# reference is then never the last while the communicator lives, however far a worker lags; at
# exit (atexit runs before finalization) everything held is leaked, so that no late release by a
# gloo thread can be the last.
# Bounded: a training loop lends the same objects at every step (no growth over any number of
# steps). A communicator that dies (its Task re-compiled, its optimizer dropped) retires its views
# to _LENT.retired, which keeps the last _RETIRED_KEEP retired sets and frees older ones (what
# stays open: a worker that still holds, at exit, a collective of a communicator retired that many
# re-builds earlier); a cache that passes _VIEWS_MAX distinct regions (not seen from the core)
# retires the same way and starts anew. The reused buffers: one per group, role and power of two.
_VIEWS_MAX = 4096
_RETIRED_KEEP = 8


class _Lent:
    """Everything lent to torch.distributed (see above): the live communicators' view caches, the
    retired ones, and the reused buffers of the small collectives."""

    def __init__(self):
        self.live = {}  # id(communicator) -> its view cache (dict)
        self.retired = collections.deque(maxlen=_RETIRED_KEEP)
        self.buffers = {}  # (id(group), role, dtype, numel, device) -> tensor

    def count(self):
        """The number of tensors held (for tests: bounded over any number of steps)."""
        n = sum(len(c) for c in self.live.values()) + sum(len(c) for c in self.retired)
        return n + sum(len(b) if isinstance(b, list) else 1 for b in self.buffers.values())

    def retire(self, key):
        cache = self.live.pop(key, None)
        if cache:
            self.retired.append(cache)


_LENT = _Lent()


def _retire(key):
    """A communicator died (weakref.finalize): its views go to the retired ring."""
    lent = globals().get("_LENT")  # None once finalization has cleared the module
    if lent is not None:
        lent.retire(key)


def _pow2(n):
    return 1 << max(int(n) - 1, 0).bit_length()


def _buffer(group, role, dtype, n, list_of=0):
    """A reused tensor of _pow2(n) elements on the group's carrier device (NCCL moves device
    tensors only: the current CUDA device; gloo: the host), its elements from n on zero (the
    caller fills the first n: the padding is the same on every rank); or, list_of > 0, a list of
    list_of such tensors to receive into. Held in _LENT.buffers (see there)."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else None
    key = (id(group), role, dtype, _pow2(n), str(device), list_of)
    buf = _LENT.buffers.get(key)
    if buf is None:
        make = lambda: torch.zeros(_pow2(n), dtype=dtype, device=device)  # noqa: E731
        buf = [make() for _ in range(list_of)] if list_of else make()
        _LENT.buffers[key] = buf
    elif not list_of:
        buf[n:].zero_()
    return buf


@atexit.register
def _keep_lent_at_exit():
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_LENT))  # never freed: see _LENT


def _global_rank(group, r):
    """torch 1.13's collectives name ranks globally; the core names them within the group."""
    if group is None or group is dist.group.WORLD:
        return r
    if hasattr(dist, "get_global_rank"):
        return dist.get_global_rank(group, r)
    return dist.distributed_c10d._get_global_rank(group, r)


class TorchCommunicator:
    """The methods renaissance._core._ShardedStep calls (python/src/torch_dist.cc): addresses
    are ints, ranges are bytes. Host memory for a CPU task, the task's CUDA device for a CUDA one."""

    def __init__(self, group, device):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.device = device
        self.device_id = device.index if device.type == "cuda" else -1
        self.peers = [_global_rank(group, r) for r in range(self.size)]
        self._workspace = None
        self._sum = None  # reduce_scatter_sum_f32's buffer, reused
        self._stage = None  # all_gather_v's copy of a buffer outside the arena and the workspace
        self.arena = (0, 0)  # the task's arena (address, bytes): set by attach()
        self._views = {}  # (address, bytes, device, dtype) -> the view lent for it (see _LENT)
        _LENT.live[id(self)] = self._views
        weakref.finalize(self, _retire, id(self)).atexit = False  # at exit everything stays held

    def describe(self):
        return "torch.distributed (%s, %d ranks)" % (dist.get_backend(self.group), self.size)

    def _view(self, ptr, nbytes, on_device=True):
        return _core._raw_view(ptr, nbytes, self.device_id if on_device else -1)

    def _lent(self, ptr, nbytes, dtype=torch.uint8):
        """The view of nbytes at ptr (as dtype) for a torch.distributed call: the same object at
        every call for the same region, held as long as this communicator (see _LENT)."""
        key = (int(ptr), int(nbytes), self.device_id, dtype)
        v = self._views.get(key)
        if v is None:
            if len(self._views) >= _VIEWS_MAX:  # more distinct regions than a Task has: a new cache
                _LENT.retire(id(self))
                self._views = _LENT.live[id(self)] = {}
            v = self._view(ptr, nbytes)
            if dtype != torch.uint8:
                v = v.view(dtype)
            self._views[key] = v
        return v

    def _owned(self, ptr, nbytes):
        """Whether [ptr, ptr + nbytes) lies in memory that lives as long as this communicator and
        is the same at every step: the arena, the workspace, the sum buffer."""
        spans = [self.arena]
        for t in (self._workspace, self._sum):
            if t is not None:
                spans.append((t.data_ptr(), t.numel() * t.element_size()))
        return any(a <= ptr and ptr + nbytes <= a + n for a, n in spans)

    def all_gather_v(self, buf, offsets, counts):
        # Rank r's block broadcast from r, in rank order: the blocks may differ in size, which
        # torch's all_gather does not take (NCCL's neither; the core's NCCL communicator does the same).
        blocks = [r for r in range(self.size) if counts[r]]
        if not blocks:
            return
        lo = min(offsets[r] for r in blocks)
        hi = max(offsets[r] + counts[r] for r in blocks)
        if self._owned(buf + lo, hi - lo):
            for r in blocks:
                dist.broadcast(self._lent(buf + offsets[r], counts[r]), src=self.peers[r], group=self.group)
            return
        # A buffer of the caller's (read_state's host destination, at another address each call):
        # the blocks move through this communicator's stage (views cached by their place in it).
        if self._stage is None or self._stage.numel() < hi - lo:
            self._stage = torch.empty(_pow2(hi - lo), dtype=torch.uint8, device=self.device)
        at = self._stage.data_ptr() - lo
        me = self.rank
        if counts[me]:
            self._view(at + offsets[me], counts[me]).copy_(self._view(buf + offsets[me], counts[me]))
        for r in blocks:
            dist.broadcast(self._lent(at + offsets[r], counts[r]), src=self.peers[r], group=self.group)
        for r in blocks:
            if r != me:
                self._view(buf + offsets[r], counts[r]).copy_(self._view(at + offsets[r], counts[r]))

    def all_to_all_v(self, send, send_offsets, send_counts, recv, recv_offsets, recv_counts):
        # Point to point, batched (gloo and NCCL both take it); the own block is a local copy.
        ops = []
        for r in range(self.size):
            if r == self.rank:
                if send_counts[r]:
                    self._view(recv + recv_offsets[r], recv_counts[r]).copy_(
                        self._view(send + send_offsets[r], send_counts[r]))
                continue
            if recv_counts[r]:
                ops.append(dist.P2POp(dist.irecv, self._lent(recv + recv_offsets[r], recv_counts[r]),
                                      self.peers[r], self.group))
            if send_counts[r]:
                ops.append(dist.P2POp(dist.isend, self._lent(send + send_offsets[r], send_counts[r]),
                                      self.peers[r], self.group))
        if ops:
            for work in dist.batch_isend_irecv(ops):
                work.wait()

    def reduce_scatter_sum_f32(self, send, recv, counts):
        # `fast`: the backend's own sum (gloo has no reduce_scatter: an all_reduce of a copy,
        # then this rank's block). No bitwise promise, as in the core.
        total = sum(counts)
        if self._sum is None or self._sum.numel() < total:
            self._sum = torch.empty(max(total, 1), dtype=torch.float32, device=self.device)
        whole = self._lent(self._sum.data_ptr(), 4 * total, torch.float32)
        whole.copy_(self._view(send, 4 * total).view(torch.float32))
        dist.all_reduce(whole, op=dist.ReduceOp.SUM, group=self.group)
        first = sum(counts[:self.rank])
        mine = counts[self.rank]
        if mine:
            self._view(recv, 4 * mine).view(torch.float32).copy_(whole[first:first + mine])

    def all_reduce_max_i32(self, values, count):
        if count:
            dist.all_reduce(self._lent(values, 4 * count, torch.int32), op=dist.ReduceOp.MAX, group=self.group)

    def barrier(self):
        dist.barrier(group=self.group)

    # Device memory only (a CUDA task): the staging copies and the workspace, through torch.
    def copy(self, dst, dst_device, src, src_device, nbytes):
        self._view(dst, nbytes, dst_device).copy_(self._view(src, nbytes, src_device))

    def synchronize(self):
        """The core's ShardedStep runs its reduction on the task's CUDA stream: it waits here for
        torch's collectives and copies before that stream reads what they wrote."""
        torch.cuda.synchronize(self.device)

    def workspace(self, nbytes):
        """The core's workspace (host memory too: see _owned)."""
        if self._workspace is None or self._workspace.numel() < nbytes:
            self._workspace = torch.zeros(max(int(nbytes), 1), dtype=torch.uint8, device=self.device)
        return self._workspace.data_ptr()


def check_group(process_group, grad_reduce):
    """The constructor's checks of the distributed arguments, before anything is built."""
    if grad_reduce not in GRAD_REDUCE:
        raise ValueError("grad_reduce=%r: expected one of %s" % (grad_reduce, ", ".join(GRAD_REDUCE)))
    if process_group is None:
        if grad_reduce != "replicated":
            raise ValueError("grad_reduce=%r needs a process_group (without one the optimizer is one process)"
                             % (grad_reduce,))
        return
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("process_group given but torch.distributed is not initialized (init_process_group first)")
    if process_group is getattr(dist.GroupMember, "NON_GROUP_MEMBER", None):  # new_group() on a non-member
        raise ValueError("process_group: this process (global rank %d) is not a member of the group"
                         % dist.get_rank())
    if not isinstance(process_group, dist.ProcessGroup):
        raise TypeError("process_group must be a torch.distributed ProcessGroup (e.g. dist.group.WORLD or "
                        "dist.new_group(...)), got %s" % type(process_group).__name__)
    if dist.get_rank(process_group) < 0:
        raise ValueError("process_group: this process (global rank %d) is not a member of the group"
                         % dist.get_rank())


def digest_words(lines):
    """A configuration's (name, value) lines -> two 31-bit words (so that a word and its negation
    are both int32: agree_step finds a difference as max != min with one all_reduce(MAX))."""
    h = hashlib.blake2b("\n".join("%s=%s" % nv for nv in lines).encode(), digest_size=8).digest()
    v = int.from_bytes(h, "little")
    return [v & 0x7FFFFFFF, (v >> 31) & 0x7FFFFFFF]


def all_gather_text(group, text):
    """Every rank's `text` (any length), in rank order. Only on a path where every rank already
    knows that something differs (two collectives: the lengths, then the padded bytes)."""
    data = text.encode()
    lengths = [w[0] for w in all_gather_words(group, [len(data)])]
    n = max(max(lengths), 1)
    mine = _buffer(group, "text", torch.uint8, n)
    seen = _buffer(group, "text_seen", torch.uint8, n, len(lengths))
    if data:
        mine[:len(data)].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    dist.all_gather(seen, mine, group=group)
    return [bytes(t[:k].cpu().numpy()).decode() for t, k in zip(seen, lengths)]


def _ranks(rs):
    return "rank%s %s" % ("s" if len(rs) > 1 else "", ", ".join(str(r) for r in rs))


def mismatch_message(descriptions, when):
    """The ranks' configurations (lists of (name, value)) -> one message naming the first option
    that differs, each of its values with the ranks holding it, and the other options that differ."""
    names, seen = [], set()
    for d in descriptions:
        for name, _ in d:
            if name not in seen:
                seen.add(name)
                names.append(name)
    per = [dict(d) for d in descriptions]
    differ = []
    for name in names:
        values = [p.get(name, "(not set)") for p in per]
        if len(set(values)) > 1:
            differ.append((name, values))
    if not differ:  # equal texts with unequal digests cannot happen; said rather than hidden
        return "renaissance.torch: the ranks' configuration digests differ %s but their descriptions do not" % when
    name, values = differ[0]
    holders = {}
    for r, v in enumerate(values):
        holders.setdefault(v, []).append(r)
    also = ""
    if len(differ) > 1:
        also = " (also different: %s)" % ", ".join(n for n, _ in differ[1:])
    return ("renaissance.torch: the ranks of the process group have different configurations %s: %s differs: %s%s. "
            "Every rank must build and step the same optimizer (class, every hyperparameter of every param group, "
            "seed, precision, master_weights, stochastic_rounding, grad_reduce, parameters)"
            % (when, name, "; ".join("%s on %s" % (v, _ranks(rs)) for v, rs in holders.items()), also))


def attach(shared_tasks, process_group, grad_reduce, lines):
    """Checks that every rank of the group builds the same optimizer (`lines`: its whole
    configuration as (name, value) pairs, _Base._agreement_lines), then gives each Task a sharded
    step over the group (SharedTask.finish_step runs it). A collective: every rank of the group
    constructs its optimizer at the same point."""
    device = shared_tasks[0].device
    size = dist.get_world_size(process_group)
    rank = dist.get_rank(process_group)
    try:
        seen = all_gather_words(process_group, [size] + digest_words(lines))
    except RuntimeError as e:
        raise RuntimeError("renaissance.torch: the process group's handshake failed (%s). Every rank of the group "
                           "must construct the same optimizer with process_group= at the same point" % e) from e
    if any(w != seen[rank] for w in seen):
        texts = all_gather_text(process_group, json.dumps(lines))
        raise ValueError(mismatch_message([json.loads(t) for t in texts], "at construction"))
    for s in shared_tasks:
        comm = TorchCommunicator(process_group, device)
        s.sharded = _core._ShardedStep(s.task, comm, rank, size, grad_reduce)
        comm.arena = s.sharded.arena
        s.sharded_comm = comm


def agree_step(group, sizes, missings, lines, words=None, error=None, amp_skip=False):
    """The step's one collective before any Task of the optimizer steps: an all_reduce(MAX) of
    int32 flags, each with its negation (so that max and min come back together), holding
    - every Task's mask (1 for a parameter without a gradient): every rank must leave out the same
      parameters, or the ranks' parameters would drift apart;
    - the digest of the whole configuration as this rank will step it (`lines`, see
      _Base._agreement_lines): a hyperparameter changed on some ranks only (a scheduler stepped on
      one rank, a param_groups edit) must not run a mixed step;
    - whether this rank refused the step itself (`error`, raised before this point): the others
      must not wait for it in a collective it never joins;
    - whether the GradScaler protocol skips this step on this rank (`amp_skip`: found_inf or a
      non-finite 1/scale): a rank that skips while another steps would leave the ranks' weights
      and step counts apart, and its next step's collective would pair with the others' current
      one. A skip on every rank is a skip; on some ranks only, no rank steps and every rank raises.
    `words`: digest_words(lines) when the caller has them already.
    Any difference raises on every rank (after an all-gather of the ranks' descriptions, only then,
    to say what differs); the rank that refused re-raises its own error."""
    total = sum(sizes)
    if error is not None:
        head = [1, 0, 0, 0]
    else:
        head = [0, int(bool(amp_skip))] + (words if words is not None else digest_words(lines))
    flags = [0] * total
    if error is None:
        first = 0
        for n, missing in zip(sizes, missings):
            for j in missing:
                flags[first + j] = 1
            first += n
    vals = flags + head
    m = len(vals)
    t = _buffer(group, "agree", torch.int32, 2 * m)  # the padding is 0 on every rank
    t[:2 * m].copy_(torch.tensor(vals + [-v for v in vals], dtype=torch.int32))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    t = t[:2 * m].cpu().tolist()
    hi, lo = t[:m], [-v for v in t[m:]]
    if hi[total] or hi[total + 1:] != lo[total + 1:]:
        mine = json.dumps({"error": "%s: %s" % (type(error).__name__, error)} if error is not None else
                          {"lines": lines, "amp_skip": bool(amp_skip)})
        said = [json.loads(x) for x in all_gather_text(group, mine)]
        if error is not None:
            raise error
        refused = [r for r, d in enumerate(said) if "error" in d]
        if refused:
            raise ValueError("renaissance.torch: %s of the process group refused this step (%s); no rank stepped"
                             % (_ranks(refused), said[refused[0]]["error"]))
        skipped = [r for r, d in enumerate(said) if d["amp_skip"]]
        if 0 < len(skipped) < len(said):
            raise ValueError("renaissance.torch: the GradScaler skips this step on %s of the process group only "
                             "(found_inf, or a scale whose reciprocal is not finite, differs between the ranks: "
                             "unscale each rank's gradients after their all-reduce); no rank stepped"
                             % _ranks(skipped))
        raise ValueError(mismatch_message([d["lines"] for d in said], "at this step (a hyperparameter changed on "
                                          "some ranks only: a scheduler, a param_groups edit?); no rank stepped"))
    first = 0
    for n in sizes:
        differ = [j for j in range(n) if hi[first + j] != lo[first + j]]
        if differ:
            raise ValueError("renaissance.torch: parameter(s) %s have a gradient on some ranks of the process group "
                             "and none (None) on others; under a process_group every rank must leave out the same "
                             "parameters" % differ)
        first += n


# ---- renaissance.torch.Recorder under a process group (recorder.py) ----------------------------
# Small collectives of the Recorder's own, on the optimizer's group: every rank calls them at the
# same points (the Recorder's constructor, each recorded step, finish), as it calls step().

def all_gather_words(group, words):
    """Every rank's list of int64 `words` (the same length on every rank), in rank order."""
    n = len(words)
    mine = _buffer(group, "words", torch.int64, n)  # the padding is 0 on every rank
    seen = _buffer(group, "words_seen", torch.int64, n, dist.get_world_size(group))
    mine[:n].copy_(torch.tensor([int(w) for w in words], dtype=torch.int64))
    dist.all_gather(seen, mine, group=group)
    return [[int(w) for w in t[:n].cpu()] for t in seen]


def flag_max(group, flag):
    """The largest of the ranks' int `flag` (an all_reduce(MAX) of one int32)."""
    t = _buffer(group, "flag", torch.int32, 1)
    t[0] = int(flag)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t[0].item())


def gather_bytes(group, data):
    """Rank 0 of the group gets every rank's `data` (a flat uint8 host tensor of the same length
    on every rank), in rank order; the other ranks get None."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    n = data.numel()
    mine = _buffer(group, "gather", torch.uint8, n)
    mine[:n].copy_(data)
    out = _buffer(group, "gather_out", torch.uint8, n, size) if rank == 0 else None
    dist.gather(mine, gather_list=out, dst=_global_rank(group, 0), group=group)
    return None if out is None else [t[:n].to("cpu", copy=True) for t in out]  # the buffers are reused
