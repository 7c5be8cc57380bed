"""A layer that forward never uses: backward never reaches its parameters, so torch.optim never
steps them (their .grad stays None: no weight decay, no moments, no state), before any zero_grad
and after zero_grad(set_to_none=False) or (set_to_none=True). renaissance.torch must do the same
(construction hands no .grad to a parameter that has none), while the layers backward does reach
step as torch's do (within 1e-5 relative L2) and their gradients are still read without a copy."""
import copy

import pytest
import torch

import renaissance.torch as rt


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(5, 8)
        self.unused = torch.nn.Linear(8, 8)  # never called in forward
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


MAKERS = {
    "sgd_wd": (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.1),
               lambda ps: rt.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.1)),
    "sgd_wd_plain": (lambda ps: torch.optim.SGD(ps, lr=0.1, weight_decay=0.1),
                     lambda ps: rt.SGD(ps, lr=0.1, weight_decay=0.1)),
    "adamw": (lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
              lambda ps: rt.AdamW(ps, lr=1e-2, weight_decay=0.1)),
}
# Phases of 3 steps each: no zero_grad (gradients accumulate), zero_grad(set_to_none=False),
# zero_grad(set_to_none=True).
PHASES = (None, False, True)


def close(a, b, tol=1e-5):
    return float((a.detach() - b.detach()).norm()) <= tol * max(float(b.detach().norm()), 1e-30)


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(16, 5, generator=g), torch.randint(0, 3, (16,), generator=g)


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_unused_layer_is_never_stepped_as_in_torch(name):
    torch.manual_seed(0)
    ref_model = Net()
    model = copy.deepcopy(ref_model)
    unused0 = [p.detach().clone() for p in ref_model.unused.parameters()]
    make_ref, make = MAKERS[name]
    ref_opt, opt = make_ref(ref_model.parameters()), make(model.parameters())
    step = 0
    for phase in PHASES:
        for _ in range(3):
            for m, o in ((ref_model, ref_opt), (model, opt)):
                if phase is not None:
                    o.zero_grad(set_to_none=phase)
                x, y = batch(step)
                torch.nn.functional.cross_entropy(m(x), y).backward()
                o.step()
            step += 1
            for w0, q, p in zip(unused0, ref_model.unused.parameters(), model.unused.parameters()):
                assert torch.equal(q.detach(), w0), "torch moved the unused layer"
                assert torch.equal(p.detach(), w0), "the unused layer moved at step %d (phase %s)" % (step, phase)
            for q, p in zip(ref_model.unused.parameters(), model.unused.parameters()):
                assert q.grad is None and p.grad is None, (phase, step)
            for q, p in zip(ref_model.parameters(), model.parameters()):
                assert close(p, q), (phase, step)
            # State for the parameters backward reached only, keyed as torch keys it.
            assert sorted(opt.state_dict()["state"]) == sorted(ref_opt.state_dict()["state"]), (phase, step)
            assert all(p not in opt.state for p in model.unused.parameters())


def test_construction_gives_no_grad():
    """As torch: a parameter has no .grad before backward reaches it (one that had a .grad keeps
    its values)."""
    model = Net()
    model.fc1.bias.grad = torch.full_like(model.fc1.bias, 0.5)
    opt = rt.SGD(model.parameters(), lr=0.1)
    assert [n for n, p in model.named_parameters() if p.grad is not None] == ["fc1.bias"]
    assert torch.equal(model.fc1.bias.grad, torch.full_like(model.fc1.bias, 0.5))
    opt.zero_grad(set_to_none=False)
    assert [n for n, p in model.named_parameters() if p.grad is not None] == ["fc1.bias"]
    assert not model.fc1.bias.grad.any()


def test_reached_gradients_are_read_in_place():
    """The layers backward reaches: their fresh .grad is read where autograd left it (the gradient
    table), not copied into the arena and re-pointed."""
    model = Net()
    opt = rt.AdamW(model.parameters(), lr=1e-2)
    x, y = batch(0)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    grads = {id(p): p.grad for p in model.parameters() if p.grad is not None}
    opt.step()
    shared = opt._bindings[0].shared
    assert shared.in_place_steps == 1
    assert all(p.grad is grads[id(p)] for p in model.parameters() if p.grad is not None)


def test_a_parameter_reached_later_steps_from_then_on():
    """The unused layer used from step 3 on: it gets state at its first gradient and its own step
    count (Adam's bias correction from 1), as in torch."""
    torch.manual_seed(1)
    ref_model = Net()
    model = copy.deepcopy(ref_model)
    ref_opt, opt = torch.optim.Adam(ref_model.parameters(), lr=1e-2), rt.Adam(model.parameters(), lr=1e-2)
    for step in range(6):
        for m, o in ((ref_model, ref_opt), (model, opt)):
            o.zero_grad(set_to_none=False)
            x, y = batch(step)
            h = torch.tanh(m.fc1(x))
            if step >= 3:
                h = torch.tanh(m.unused(h))
            torch.nn.functional.cross_entropy(m.fc2(h), y).backward()
            o.step()
        for q, p in zip(ref_model.parameters(), model.parameters()):
            assert close(p, q), step
    ref_sd, sd = ref_opt.state_dict()["state"], opt.state_dict()["state"]
    assert sorted(sd) == sorted(ref_sd)
    assert [float(sd[i]["step"]) for i in sorted(sd)] == [float(ref_sd[i]["step"]) for i in sorted(ref_sd)]
