# Cases from PyTorch's own optimizer tests (TestOptimRenewed), checked against torch.optim's
# classes on whatever torch is installed: state_dict() of param_groups extended with itself, a
# parameter listed twice (in one group, across groups), parameters on a device without the fused
# step (meta).
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import renaissance.torch as rt  # noqa: E402

SHAPES = [(3, 2), (2,), (4,)]


def params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in SHAPES]


def feed(ps, step):
    g = torch.Generator().manual_seed(100 + step)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)


def same_bits(a, b):
    return np.array_equal(a.detach().numpy().view(np.uint32), b.detach().numpy().view(np.uint32))


def two_groups(cls, ps):
    extra = {"momentum": 0.9} if cls in (rt.SGD, torch.optim.SGD) else {}  # a state to pack
    return cls([{"params": ps[:2]}, {"params": ps[2:], "lr": 0.05}], lr=0.1, **extra)


@pytest.mark.parametrize("ours, theirs", [(rt.SGD, torch.optim.SGD), (rt.Adam, torch.optim.Adam),
                                          (rt.AdamW, torch.optim.AdamW)])
def test_state_dict_of_param_groups_extended_with_itself(ours, theirs):
    # TestOptimRenewed.test_state_dict_deterministic: param_groups.extend(param_groups), then
    # state_dict(): torch packs a repeated parameter with the index of its first listing.
    ps, qs = params(), params()
    opt, ref = two_groups(ours, ps), two_groups(theirs, qs)
    for step in range(3):
        feed(ps, step)
        feed(qs, step)
        opt.step()
        ref.step()
    before = copy.deepcopy(opt.state_dict())  # a copy: the state dict holds live views
    opt.param_groups.extend(opt.param_groups)
    ref.param_groups.extend(ref.param_groups)
    sd, sd_ref = opt.state_dict(), ref.state_dict()
    assert [g["params"] for g in sd["param_groups"]] == [g["params"] for g in sd_ref["param_groups"]] \
        == [[0, 1], [2], [0, 1], [2]]
    assert sd["param_groups"][-1]["lr"] == 0.05 and sorted(sd["state"]) == sorted(sd_ref["state"]) == [0, 1, 2]
    for k, st in before["state"].items():
        for name, t in st.items():
            assert same_bits(sd["state"][k][name], t), (k, name)
    # A step would update the repeated parameters twice (torch does): refused, nothing changed.
    w = [p.detach().clone() for p in ps]
    feed(ps, 3)
    with pytest.raises(ValueError, match="param group 2 lists the parameters of param group 0"):
        opt.step()
    assert all(same_bits(p, x) for p, x in zip(ps, w))
    # The repeats removed, the optimizer steps on as one that never had them.
    del opt.param_groups[2:]
    twin = two_groups(ours, [torch.nn.Parameter(x.clone()) for x in w])
    twin.load_state_dict(before)
    feed(twin.param_groups[0]["params"] + twin.param_groups[1]["params"], 3)
    opt.step()
    twin.step()
    assert all(same_bits(p, q) for p, q in zip(ps, twin.param_groups[0]["params"] + twin.param_groups[1]["params"]))


def test_a_group_listing_part_of_another_is_still_refused_by_state_dict():
    ps = params()
    opt = two_groups(rt.Adam, ps)
    opt.param_groups.append(dict(opt.param_groups[0], params=ps[:1]))
    with pytest.raises(ValueError, match="param group 2 lists the parameters of param group 0"):
        opt.state_dict()


def test_a_parameter_in_two_groups_is_torchs_error():
    ps = params()
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter group") as theirs:
        torch.optim.SGD([{"params": ps[:2]}, {"params": [ps[2], ps[0]]}], lr=0.1)
    for cls in (rt.SGD, rt.Adam, rt.AdamW):
        with pytest.raises(ValueError, match=str(theirs.value)):
            cls([{"params": ps[:2]}, {"params": [ps[2], ps[0]]}], lr=0.1)
        opt = cls(ps[:2], lr=0.1)
        with pytest.raises(ValueError, match=str(theirs.value)):
            opt.add_param_group({"params": [ps[2], ps[1]]})
        assert len(opt.param_groups) == 1


def test_a_parameter_twice_in_one_group_is_refused_naming_torchs_warning():
    # torch warns and updates it once per listing; one arena slot cannot: refused.
    p = torch.nn.Parameter(torch.zeros(2))
    with pytest.warns(UserWarning, match="a parameter group with duplicate parameters"):
        ref = torch.optim.SGD([p, p], lr=1.0)
    p.grad = torch.ones(2)
    ref.step()
    assert p.tolist() == [-2.0, -2.0]
    for cls in (rt.SGD, rt.Adam, rt.AdamW):
        with pytest.raises(ValueError, match=r"listed twice in param group 0: torch warns .*duplicate parameters"):
            cls([p, p], lr=1.0)


@pytest.mark.parametrize("cls", [rt.SGD, rt.Adam, rt.AdamW])
def test_meta_parameters_are_torchs_fused_error(cls):
    # TestOptimRenewed.test_fused_error_on_params_on_meta: torch's fused step refuses meta
    # parameters with this RuntimeError (at step(); here at construction, nothing is bound).
    ps = list(torch.nn.Linear(2, 3, device="meta").parameters())
    for kwargs in ({"fused": True}, {}):
        with pytest.raises(RuntimeError, match="^`fused=True` requires all the params to be floating point Tensors "
                                               "of supported devices: \\['cpu', 'cuda'\\] but torch.float32 and meta"):
            cls(ps, lr=0.1, **kwargs)
