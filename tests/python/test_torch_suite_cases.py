# Cases from PyTorch's own optimizer tests (TestOptimRenewed), checked against torch.optim's
# classes on whatever torch is installed: state_dict() of param_groups extended with itself, a
# parameter listed twice (in one group, across groups), parameters on a device without the fused
# step (meta: taken at construction, torch's error at a step over one with a gradient).
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


FUSED_META = "^`fused=True` requires all the params to be floating point Tensors of supported devices: "


def meta_model():
    # test_fused_error_on_params_on_meta's model; `with torch.device("meta")` (torch >= 2.0)
    # spelled as the layers' device argument, which torch 1.13 has.
    return torch.nn.Sequential(torch.nn.Linear(2, 3, device="meta"), torch.nn.Sigmoid(),
                               torch.nn.Linear(3, 1, device="meta"), torch.nn.Sigmoid()).to(torch.float32)


@pytest.mark.parametrize("cls", [rt.SGD, rt.Adam, rt.AdamW])
def test_fused_error_on_params_on_meta(cls):
    # TestOptimRenewed.test_fused_error_on_params_on_meta (torch 2.11), step by step: the optimizer
    # is built over meta parameters; a step with meta gradients is torch's fused RuntimeError;
    # zero_grad; model.to_empty() gives the model new parameter objects on the cpu (torch 1.13
    # and 2.11 alike: meta and cpu tensors cannot share a parameter object), whose gradients the
    # optimizer does not hold, so the last step has nothing to step and must not raise.
    model = meta_model()
    opt = cls(model.parameters(), fused=True)
    with torch.no_grad():
        for p in model.parameters():
            p.grad = torch.rand_like(p)
    with pytest.raises(RuntimeError, match=FUSED_META + r"\['cpu', 'cuda'\] but torch.float32 and meta"):
        opt.step()
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for g in opt.param_groups for p in g["params"])
    model.to_empty(device="cpu")
    for p in model.parameters():
        p.grad = torch.rand_like(p)
    opt.step()


@pytest.mark.parametrize("cls", [rt.SGD, rt.Adam, rt.AdamW])
def test_meta_parameters_without_gradients_step_nothing_and_pack_no_state(cls):
    # torch's fused step checks only the parameters that have a gradient; its state_dict before
    # a step holds no state. A step with the refused gradient keeps refusing (it stays on meta).
    model = meta_model()
    opt = cls(model.parameters(), lr=0.1)
    assert opt.step(lambda: 7.0) == 7.0
    sd = opt.state_dict()
    assert sd["state"] == {} and [g["params"] for g in sd["param_groups"]] == [[0, 1, 2, 3]]
    opt.zero_grad(set_to_none=False)  # no gradient: nothing to zero
    next(model.parameters()).grad = torch.zeros(3, 2, device="meta")
    for _ in range(2):
        with pytest.raises(RuntimeError, match=FUSED_META):
            opt.step()
    opt.zero_grad(set_to_none=False)  # torch's: the meta gradient zeroed in place, kept
    assert next(model.parameters()).grad is not None
    opt.zero_grad()
    assert next(model.parameters()).grad is None
    for call in (opt.fingerprint, lambda: opt.load_state_dict(sd)):  # need the arena: refused alike
        with pytest.raises(RuntimeError, match=FUSED_META):
            call()


def test_meta_parameters_are_still_checked_at_construction():
    # Deferred binding defers only the device: hyperparameters, dtypes, mixed devices and the
    # groups' parameters are the constructor's errors as before.
    ps = list(meta_model().parameters())
    with pytest.raises(ValueError, match="Invalid learning rate"):
        rt.AdamW(ps, lr=-1.0)
    with pytest.raises(ValueError, match="different devices"):
        rt.AdamW(ps + [torch.nn.Parameter(torch.zeros(2))])
    with pytest.raises(ValueError, match="more than one parameter group"):
        rt.AdamW([{"params": ps[:2]}, {"params": ps[1:]}])
    opt = rt.AdamW(ps[:2])
    opt.add_param_group({"params": ps[2:], "lr": 0.5})
    with pytest.raises(ValueError, match="Invalid learning rate"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2, device="meta"))], "lr": -1.0})
    assert len(opt.param_groups) == 2
    with pytest.raises(ValueError, match="different devices"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})


@pytest.mark.skipif(not hasattr(torch.utils, "swap_tensors"),
                    reason="torch 1.13 cannot move a meta parameter object to the cpu in place (no "
                           "torch.utils.swap_tensors, and set_data refuses a meta/cpu pair)")
@pytest.mark.parametrize("cls, theirs", [(rt.SGD, torch.optim.SGD), (rt.Adam, torch.optim.Adam),
                                         (rt.AdamW, torch.optim.AdamW)])
def test_meta_parameters_moved_in_place_are_bound_at_the_first_step(cls, theirs):
    # The same parameter objects moved to the cpu (swap_tensors, what
    # torch.__future__.set_swap_module_params_on_conversion(True) makes to_empty do): the first
    # step binds and steps them as torch steps them.
    def moved(model, values):
        for p, v in zip(model.parameters(), values):
            torch.utils.swap_tensors(p, torch.nn.Parameter(v.clone()))
    g = torch.Generator().manual_seed(3)
    values = [torch.randn(*p.shape, generator=g) for p in meta_model().parameters()]
    grads = [torch.randn(*v.shape, generator=g) for v in values]
    runs = []
    for make in (cls, theirs):
        model = meta_model()
        opt = make(model.parameters(), lr=0.1)
        moved(model, values)
        for _ in range(2):
            for p, d in zip(model.parameters(), grads):
                p.grad = d.clone()
            opt.step()
        runs.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*runs):
        assert torch.allclose(a, b, rtol=0, atol=1e-6), (a, b)
