"""The per-parameter state keys of every renaissance.torch class against torch's own optimizers
after one step (the independent oracle: torch.optim's state), group by group where the keys
depend on the group (SGD with and without momentum, amsgrad on and off, MuonWithAuxAdam's Muon and
aux groups); the classes read them from the core's tables (_core.torch_state_keys). Every class
also keeps `step`, each parameter's applied-step count, which torch's SGD and Muon do not, except
SGD without momentum, whose state is exactly the installed torch's (test_torch_sgd_plain_state.py)."""
import pytest

import torch  # noqa: E402  (CI installs it: scripts/test_python.sh)

import renaissance._core as core  # noqa: E402
import renaissance.torch as rt  # noqa: E402

SHAPES = [(4, 3), (5, 2)]  # 2-D: torch.optim.Muon takes matrices only
HAS_TORCH_MUON = hasattr(torch.optim, "Muon")
# torch.optim.Muon's state (torch >= 2.9: `state["momentum_buffer"] = torch.zeros_like(grad)`),
# for the torch versions that lack the class.
TORCH_MUON_KEYS = {"momentum_buffer"}


def params(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in SHAPES]


def one_step(opt, ps, seed=7):
    g = torch.Generator().manual_seed(seed)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)
    opt.step()


def torch_keys(state):
    """torch's keys of one parameter's state; torch 1.13's SGD stores momentum_buffer=None without
    momentum (torch >= 2 stores nothing), and a None buffer is no buffer in either."""
    return {k for k, v in state.items() if v is not None}


def our_keys(opt, p):
    """The keys of p's state (none: p has no entry, as torch >= 2's SGD without momentum)."""
    i = next(i for i, q in enumerate(q for g in opt.param_groups for q in g["params"]) if q is p)
    if p not in opt.state:
        assert i not in opt.state_dict()["state"]
        return set()
    keys = set(opt.state[p].keys())
    assert set(opt.state_dict()["state"][i].keys()) == keys  # state_dict() carries the same keys
    return keys


def group_pairs(ours_cls, torch_cls, groups, raw=False):
    """One step of ours and of torch's optimizer over the same groups (fresh parameters each), then
    [(ours' keys, torch's keys)] per parameter (raw: torch's None entries too)."""
    theirs_keys = (lambda state: set(state.keys())) if raw else torch_keys
    mine = [dict(g, params=params(i)) for i, g in enumerate(groups)]
    theirs = [dict(g, params=params(i)) for i, g in enumerate(groups)]
    ours_opt, torch_opt = ours_cls(mine), torch_cls(theirs)
    one_step(ours_opt, [p for g in mine for p in g["params"]])
    one_step(torch_opt, [p for g in theirs for p in g["params"]])
    return [(our_keys(ours_opt, p), theirs_keys(torch_opt.state.get(q, {})))
            for g, h in zip(mine, theirs) for p, q in zip(g["params"], h["params"])]


def test_sgd_keys_are_torchs_with_and_without_momentum_per_group():
    groups = [dict(lr=0.1, momentum=0.0), dict(lr=0.1, momentum=0.9), dict(lr=0.1, momentum=0.9, nesterov=True)]
    pairs = group_pairs(rt.SGD, torch.optim.SGD, groups, raw=True)
    # Without momentum torch 1.13 stores momentum_buffer=None, torch >= 2 nothing: ours is the same.
    plain = {"momentum_buffer"} if torch.__version__ < "2" else set()
    assert [t for _, t in pairs] == [plain, plain, {"momentum_buffer"}, {"momentum_buffer"},
                                     {"momentum_buffer"}, {"momentum_buffer"}]  # torch's, as this test reads it
    for ours, theirs in pairs[:2]:
        assert ours == theirs
    for ours, theirs in pairs[2:]:
        assert ours == theirs | {"step"}


@pytest.mark.parametrize("ours_cls,torch_cls", [(rt.Adam, torch.optim.Adam), (rt.AdamW, torch.optim.AdamW)])
def test_adam_keys_are_torchs_with_and_without_amsgrad_per_group(ours_cls, torch_cls):
    pairs = group_pairs(ours_cls, torch_cls, [dict(lr=1e-3, amsgrad=False), dict(lr=1e-3, amsgrad=True)])
    adam = {"step", "exp_avg", "exp_avg_sq"}
    assert [t for _, t in pairs] == [adam, adam, adam | {"max_exp_avg_sq"}, adam | {"max_exp_avg_sq"}]
    for ours, theirs in pairs:
        assert ours == theirs


@pytest.mark.skipif(not HAS_TORCH_MUON, reason="torch %s has no torch.optim.Muon (torch >= 2.9); "
                    "test_muon_keys_are_torch_muons_literal checks its keys" % torch.__version__)
def test_muon_keys_are_torch_optim_muons():
    pairs = group_pairs(rt.Muon, torch.optim.Muon, [dict(lr=0.02)])
    for ours, theirs in pairs:
        assert theirs == TORCH_MUON_KEYS
        assert ours == theirs | {"step"}


def test_muon_keys_are_torch_muons_literal():
    ps = params(0)
    opt = rt.Muon(ps, lr=0.02)
    one_step(opt, ps)
    for p in ps:
        assert our_keys(opt, p) == TORCH_MUON_KEYS | {"step"}


def test_muon_with_aux_adam_groups_keep_torch_muons_and_adamws_keys():
    """A Muon group's state is torch.optim.Muon's, an aux group's torch.optim.AdamW's (one core Task)."""
    muon_ps, aux_ps = params(0), params(1)
    opt = rt.MuonWithAuxAdam([dict(params=muon_ps, use_muon=True), dict(params=aux_ps, use_muon=False)])
    one_step(opt, muon_ps + aux_ps)
    theirs_aux = params(1)
    adamw = torch.optim.AdamW(theirs_aux, lr=3e-4, betas=(0.9, 0.95), eps=1e-10, weight_decay=0)
    one_step(adamw, theirs_aux)
    if HAS_TORCH_MUON:
        theirs_muon = params(0)
        muon = torch.optim.Muon(theirs_muon, lr=0.02)
        one_step(muon, theirs_muon)
        muon_keys = [torch_keys(muon.state[q]) for q in theirs_muon]
    else:
        muon_keys = [TORCH_MUON_KEYS] * len(muon_ps)
    for p, theirs in zip(muon_ps, muon_keys):
        assert our_keys(opt, p) == theirs | {"step"}
    for p, q in zip(aux_ps, theirs_aux):
        assert our_keys(opt, p) == torch_keys(adamw.state[q]) == {"step", "exp_avg", "exp_avg_sq"}


@pytest.mark.parametrize("cls,keys", [
    (rt.LARS, {"momentum_buffer"}),          # torch.optim.SGD's name of its momentum
    (rt.Lion, {"exp_avg"}),                  # timm's Lion
    (rt.LAMB, {"exp_avg", "exp_avg_sq"}),    # timm's Lamb
])
def test_keys_of_the_classes_without_a_torch_counterpart(cls, keys):
    ps = params(0)
    opt = cls(ps)
    one_step(opt, ps)
    for p in ps:
        assert our_keys(opt, p) == keys | {"step"}


def test_core_torch_state_keys_arguments():
    assert core.torch_state_keys("muon", False, "bias_like") == {"M": "exp_avg", "V": "exp_avg_sq"}
    assert core.torch_state_keys("muon") == {"M": "momentum_buffer"}
    with pytest.raises(ValueError, match="unknown kind 'nadam'"):
        core.torch_state_keys("nadam")
    with pytest.raises(ValueError, match="group 'bias'"):
        core.torch_state_keys("adam", False, "bias")
    with pytest.raises(ValueError, match="kind lamb has no amsgrad"):
        core.torch_state_keys("lamb", True)
