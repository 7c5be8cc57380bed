"""renaissance.torch.SGD with momentum 0 keeps the state the installed torch.optim.SGD keeps: none
on torch >= 2 (its step stores a momentum_buffer only with momentum), {'momentum_buffer': None}
per stepped parameter on torch 1.13. The installed torch is the reference: the same steps, a
state_dict() round trip, and a checkpoint in either version's format loaded into both."""
import copy

import pytest
import torch

import renaissance.torch as rt

HYPER = dict(lr=0.1, weight_decay=0.01)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))


def run(net, opt, steps, first=0, only_first_layer=False):
    """`steps` steps; with only_first_layer the second layer gets no gradient (torch keeps no
    state for it on any version)."""
    for s in range(first, first + steps):
        g = torch.Generator().manual_seed(7 + s)
        x, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(x), y).backward()
        if only_first_layer:
            for p in net[2].parameters():
                p.grad = None
        opt.step()


def same_state(ours, theirs):
    """Equal state dicts' 'state': the same parameter indices, keys and values (None or equal
    tensors)."""
    assert sorted(ours) == sorted(theirs), (ours, theirs)
    for k in theirs:
        assert sorted(ours[k]) == sorted(theirs[k]), (k, ours[k], theirs[k])
        for key, value in theirs[k].items():
            if value is None:
                assert ours[k][key] is None, (k, key, ours[k][key])
            else:
                assert torch.equal(torch.as_tensor(ours[k][key]), torch.as_tensor(value)), (k, key)


def pair():
    ref_net = model()
    net = copy.deepcopy(ref_net)
    return ref_net, torch.optim.SGD(ref_net.parameters(), **HYPER), net, rt.SGD(net.parameters(), **HYPER)


def test_the_installed_torch_is_one_of_the_two_behaviours():
    ref_net, ref = pair()[:2]
    run(ref_net, ref, 1)
    state = ref.state_dict()["state"]
    if torch.__version__ < "2":
        assert state and all(s == {"momentum_buffer": None} for s in state.values()), state
    else:
        assert state == {}, state


def test_state_is_torchs_after_steps_and_a_parameter_without_gradient_has_none():
    ref_net, ref, net, opt = pair()
    same_state(opt.state_dict()["state"], ref.state_dict()["state"])  # before any step: none
    run(ref_net, ref, 2, only_first_layer=True)
    run(net, opt, 2, only_first_layer=True)
    same_state(opt.state_dict()["state"], ref.state_dict()["state"])
    run(ref_net, ref, 2, first=2)
    run(net, opt, 2, first=2)
    same_state(opt.state_dict()["state"], ref.state_dict()["state"])
    assert sorted(map(id, opt.state)) == sorted(id(p) for p, q in zip(net.parameters(), ref_net.parameters())
                                                if q in ref.state)
    for p, q in zip(net.parameters(), ref_net.parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6)


def go_on_as_torch(ref_net, ref, net, opt, first):
    """Two more steps on both sides from step `first`: the same state as torch's and the same
    parameters."""
    run(ref_net, ref, 2, first=first)
    run(net, opt, 2, first=first)
    same_state(opt.state_dict()["state"], ref.state_dict()["state"])
    for p, q in zip(net.parameters(), ref_net.parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6)


def test_a_state_dict_round_trip_keeps_the_state_and_the_steps():
    ref_net, ref, net, opt = pair()
    run(ref_net, ref, 3)
    run(net, opt, 3)
    sd = opt.state_dict()
    fresh = rt.SGD(net.parameters(), **HYPER)
    fresh.load_state_dict(sd)
    same_state(fresh.state_dict()["state"], ref.state_dict()["state"])
    go_on_as_torch(ref_net, ref, net, fresh, first=3)


@pytest.mark.parametrize("written_by", ["torch 1.13", "torch 2"])
def test_a_checkpoint_of_either_torch_loads_as_the_installed_torch_loads_it(written_by):
    ref_net, ref, net, opt = pair()
    run(ref_net, ref, 1)
    run(net, opt, 1)
    groups = ref.state_dict()["param_groups"]
    n = len(groups[0]["params"])
    # torch 1.13 stored a None buffer for every parameter it stepped; torch >= 2 stores nothing.
    state = {i: {"momentum_buffer": None} for i in range(n)} if written_by == "torch 1.13" else {}
    checkpoint = {"state": state, "param_groups": groups}
    ref.load_state_dict(copy.deepcopy(checkpoint))
    opt.load_state_dict(copy.deepcopy(checkpoint))
    same_state(opt.state_dict()["state"], ref.state_dict()["state"])
    go_on_as_torch(ref_net, ref, net, opt, first=1)
