#!/usr/bin/python3
"""Writes tests/optim/fixtures/optim_groups_ref.bin: reference trajectories of
the dgrad optimizers with parameter groups (dg_optim_set_group), from
torch.optim.SGD / AdamW given the corresponding param_groups, and from the
papers' LAMB and LARS (as make_optim_fixtures.py) with a per-parameter lr and
weight decay.

Run with Debian's /usr/bin/python3 (python3-torch 1.13):
    /usr/bin/python3 tests/optim/make_group_fixtures.py

A group is (selector, weight_decay, lr_scale); selectors: 0 ndim <= 1,
1 name prefix "head.", 2 name suffix ".bias". As in dgrad, groups apply in
order and a later group takes a parameter an earlier one selected; the
others form the default group (the optimizer's own options). A group's lr is
float32(base lr * lr_scale), and the base lr changes before step
`lr_change_step` (torch: every group's lr rescaled, as a scheduler does).

Format (little-endian throughout):
  char[8]  magic "DGGRPFX\\0"
  u32      version (1)
  u32      n_params; per parameter: char[24] name (NUL-padded), u32 ndim,
           u32 dims[ndim]
  u32      n_steps
  f32      initial values of every parameter, concatenated in order
  f32      gradients, n_steps x (all parameters concatenated)
  u32      n_cases; per case:
             char[16] name, u32 kind (0 sgd, 1 adamw, 2 lamb, 3 lars)
             f32[9]   lr, momentum, dampening, nesterov, weight_decay,
                      beta1, beta2, eps, trust_coef
             u32      lr_change_step, f32 new base lr
             u32      n_groups; per group: u32 selector, f32 wd, f32 lr_scale
             f32      parameters after each step, n_steps x total
"""
import os
import struct

import numpy as np
import torch

VERSION = 1
N_STEPS = 5
LR_CHANGE = 3
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures",
                   "optim_groups_ref.bin")
PARAMS = [("enc.weight", (5, 3)), ("enc.bias", (5,)), ("norm.weight", (5,)),
          ("head.weight", (2, 5)), ("head.bias", (2,))]


def f32(x):
    return float(np.float32(x))


def selects(sel, name, shape):
    if sel == 0:
        return len(shape) <= 1
    if sel == 1:
        return name.startswith("head.")
    return name.endswith(".bias")


def assign(groups):
    """Group index of each parameter: 0 default, k for groups[k - 1]."""
    out = []
    for name, shape in PARAMS:
        k = 0
        for j, (sel, _, _) in enumerate(groups):
            if selects(sel, name, shape):
                k = j + 1
        out.append(k)
    return out


def make_inputs():
    g = torch.Generator().manual_seed(4321)
    init = [torch.randn(*s, generator=g) * (0.5 if len(s) == 1 else 1.0) for _, s in PARAMS]
    grads = [[torch.randn(*s, generator=g) for _, s in PARAMS] for _ in range(N_STEPS)]
    return init, grads


def per_param(groups, base_wd, base_lr):
    """(lr, wd) of each parameter under base lr base_lr."""
    a = assign(groups)
    return [(base_lr, base_wd) if k == 0 else
            (f32(base_lr * groups[k - 1][2]), groups[k - 1][1]) for k in a]


def run_torch(opt_cls, init, grads, groups, lr, new_lr, wd, **kw):
    ps = [p.clone().requires_grad_(True) for p in init]
    a = assign(groups)
    pg = []
    for k in range(len(groups) + 1):
        members = [p for p, gk in zip(ps, a) if gk == k]
        if not members:
            continue
        d = {"params": members, "scale": 1.0 if k == 0 else groups[k - 1][2]}
        d["weight_decay"] = wd if k == 0 else groups[k - 1][1]
        d["lr"] = f32(lr * d["scale"])
        pg.append(d)
    opt = opt_cls(pg, lr=lr, weight_decay=wd, **kw)
    traj = []
    for s, gs in enumerate(grads):
        if s == LR_CHANGE:
            for d in opt.param_groups:
                d["lr"] = f32(new_lr * d["scale"])
        for p, g in zip(ps, gs):
            p.grad = g.clone()
        opt.step()
        traj.append([p.detach().clone() for p in ps])
    return traj


def run_lamb(init, grads, groups, lr, new_lr, b1, b2, eps, wd):
    ps = [p.clone() for p in init]
    m = [torch.zeros_like(p) for p in ps]
    v = [torch.zeros_like(p) for p in ps]
    traj = []
    for t, gs in enumerate(grads, start=1):
        hyper = per_param(groups, wd, lr if t - 1 < LR_CHANGE else new_lr)
        for i, g in enumerate(gs):
            plr, pwd = hyper[i]
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat = m[i] / (1 - b1 ** t)
            v_hat = v[i] / (1 - b2 ** t)
            r = m_hat / (v_hat.sqrt() + eps) + pwd * ps[i]
            wn, rn = ps[i].double().norm().item(), r.double().norm().item()
            ratio = wn / rn if wn > 0 and rn > 0 else 1.0
            ps[i] = ps[i] - plr * ratio * r
        traj.append([p.clone() for p in ps])
    return traj


def run_lars(init, grads, groups, lr, new_lr, mom, wd, trust, eps):
    """ndim <= 1 parameters excluded (no adaptation, no decay), group lr."""
    ps = [p.clone() for p in init]
    buf = [torch.zeros_like(p) for p in ps]
    traj = []
    for s, gs in enumerate(grads):
        hyper = per_param(groups, wd, lr if s < LR_CHANGE else new_lr)
        for i, g in enumerate(gs):
            plr, pwd = hyper[i]
            if ps[i].dim() <= 1:
                buf[i] = mom * buf[i] + plr * g
            else:
                wn, gn = ps[i].double().norm().item(), g.double().norm().item()
                local = trust * wn / (gn + pwd * wn + eps) if wn > 0 and gn > 0 else 1.0
                buf[i] = mom * buf[i] + (plr * local) * (g + pwd * ps[i])
            ps[i] = ps[i] - buf[i]
        traj.append([p.clone() for p in ps])
    return traj


def flat(ts):
    return np.concatenate([t.detach().numpy().astype("<f4").ravel() for t in ts])


NO_DECAY_HEAD = [(0, f32(0.0), f32(1.0)), (1, f32(0.05), f32(0.5))]
HEAD_THEN_1D = [(1, f32(0.05), f32(0.5)), (0, f32(0.0), f32(2.0))]
BIAS_ONLY = [(2, f32(0.0), f32(0.25))]


def cases(init, grads):
    out = []
    for name, mom, nest, wd, groups in [("sgd_groups", 0.9, 0, 0.01, NO_DECAY_HEAD),
                                        ("sgd_nest_groups", 0.9, 1, 0.05, HEAD_THEN_1D),
                                        ("sgd_plain_bias", 0.0, 0, 0.02, BIAS_ONLY)]:
        lr, mom, wd = f32(0.1), f32(mom), f32(wd)
        new_lr = f32(lr * 0.5)
        tr = run_torch(torch.optim.SGD, init, grads, groups, lr, new_lr, wd, momentum=mom,
                       nesterov=bool(nest))
        out.append((name, 0, [lr, mom, 0, nest, wd, 0, 0, 0, 0], new_lr, groups, tr))
    b1, b2, eps = f32(0.9), f32(0.999), f32(1e-8)
    for name, wd, groups in [("adamw_groups", 0.1, NO_DECAY_HEAD),
                             ("adamw_head_1d", 0.2, HEAD_THEN_1D)]:
        lr, wd = f32(0.01), f32(wd)
        new_lr = f32(lr * 0.5)
        tr = run_torch(torch.optim.AdamW, init, grads, groups, lr, new_lr, wd, betas=(b1, b2),
                       eps=eps)
        out.append((name, 1, [lr, 0, 0, 0, wd, b1, b2, eps, 0], new_lr, groups, tr))
    lr, wd, leps = f32(0.02), f32(0.01), f32(1e-6)
    new_lr = f32(lr * 0.5)
    tr = run_lamb(init, grads, NO_DECAY_HEAD, lr, new_lr, b1, b2, leps, wd)
    out.append(("lamb_groups", 2, [lr, 0, 0, 0, wd, b1, b2, leps, 0], new_lr, NO_DECAY_HEAD, tr))
    lr, mom, wd, trust = f32(0.5), f32(0.9), f32(5e-4), f32(0.02)
    new_lr = f32(lr * 0.5)
    tr = run_lars(init, grads, HEAD_THEN_1D, lr, new_lr, mom, wd, trust, 0.0)
    out.append(("lars_groups", 3, [lr, mom, 0, 0, wd, 0, 0, 0, trust], new_lr, HEAD_THEN_1D, tr))
    return out


def main():
    torch.set_default_dtype(torch.float32)
    init, grads = make_inputs()
    b = bytearray(b"DGGRPFX\0")
    b += struct.pack("<2I", VERSION, len(PARAMS))
    for name, shape in PARAMS:
        b += name.encode().ljust(24, b"\0")
        b += struct.pack("<I", len(shape)) + struct.pack("<%dI" % len(shape), *shape)
    b += struct.pack("<I", N_STEPS)
    b += flat(init).tobytes()
    for gs in grads:
        b += flat(gs).tobytes()
    cs = cases(init, grads)
    b += struct.pack("<I", len(cs))
    for name, kind, hyper, new_lr, groups, traj in cs:
        b += name.encode().ljust(16, b"\0") + struct.pack("<I", kind)
        b += struct.pack("<9f", *hyper)
        b += struct.pack("<If", LR_CHANGE, new_lr)
        b += struct.pack("<I", len(groups))
        for sel, wd, scale in groups:
            b += struct.pack("<I2f", sel, wd, scale)
        for ps in traj:
            b += flat(ps).tobytes()
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "wb") as f:
        f.write(bytes(b))
    print("wrote %s (%d bytes)" % (OUT, len(b)))


if __name__ == "__main__":
    main()
