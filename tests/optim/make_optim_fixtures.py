#!/usr/bin/python3
"""Writes tests/optim/fixtures/optim_ref.bin: reference trajectories for the
dgrad optimizers, gradient clipping and LR schedules.

Run with Debian's /usr/bin/python3 (python3-torch 1.13):
    /usr/bin/python3 tests/optim/make_optim_fixtures.py

SGD and AdamW are torch.optim's own; LAMB (You et al. 2019) and LARS (You et
al. 2017) are written below from the papers' formulas. Everything is computed
in float32 as torch does; hyperparameters are rounded to float32 first so the
C side sees exactly the same numbers.

Format (little-endian throughout):
  char[8]  magic "DGOPTFX\\0"
  u32      version (1)
  u32      n_params; per parameter: u32 ndim, u32 dims[ndim]
  u32      n_steps
  f32      initial values of every parameter, concatenated in order
  f32      gradients, n_steps x (all parameters concatenated)
  u32      n_cases; per case:
             char[16] name (NUL-padded), u32 kind (0 sgd, 1 adamw, 2 lamb, 3 lars)
             f32[9]   lr, momentum, dampening, nesterov, weight_decay,
                      beta1, beta2, eps, trust_coef
             f32      parameters after each step, n_steps x total
  u32      n_clip; per case: f64 max_norm, f64 total_norm, f32 clipped grads (total)
             (the clipped gradients are those of step 0)
  u32      n_sched; per schedule: u32 kind, f32 base_lr, i64 warmup, i64 total,
             i64 step_size, f32 gamma, f32 min_lr, u32 n, f32 lr[n] (steps 0..n-1)
"""
import math
import os
import struct

import numpy as np
import torch

VERSION = 1
N_STEPS = 5
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "optim_ref.bin")


def f32(x):
    return float(np.float32(x))


def make_inputs():
    g = torch.Generator().manual_seed(1234)
    w = torch.randn(5, 3, generator=g)
    b = torch.randn(5, generator=g) * 0.1
    grads = [(torch.randn(5, 3, generator=g), torch.randn(5, generator=g) * 0.5)
             for _ in range(N_STEPS)]
    return [w, b], grads


def run_torch(opt_cls, init, grads, **kw):
    ps = [p.clone().requires_grad_(True) for p in init]
    opt = opt_cls(ps, **kw)
    traj = []
    for gs in grads:
        for p, g in zip(ps, gs):
            p.grad = g.clone()
        opt.step()
        traj.append([p.detach().clone() for p in ps])
    return traj


def run_lamb(init, grads, lr, b1, b2, eps, wd):
    ps = [p.clone() for p in init]
    m = [torch.zeros_like(p) for p in ps]
    v = [torch.zeros_like(p) for p in ps]
    traj = []
    for t, gs in enumerate(grads, start=1):
        for i, g in enumerate(gs):
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            m_hat = m[i] / (1 - b1 ** t)
            v_hat = v[i] / (1 - b2 ** t)
            r = m_hat / (v_hat.sqrt() + eps) + wd * ps[i]
            wn, rn = ps[i].double().norm().item(), r.double().norm().item()
            ratio = wn / rn if wn > 0 and rn > 0 else 1.0
            ps[i] = ps[i] - lr * ratio * r
        traj.append([p.clone() for p in ps])
    return traj


def run_lars(init, grads, lr, mom, wd, trust, eps):
    """Algorithm 1 of You et al. 2017; ndim <= 1 parameters excluded from
    adaptation and weight decay."""
    ps = [p.clone() for p in init]
    buf = [torch.zeros_like(p) for p in ps]
    traj = []
    for gs in grads:
        for i, g in enumerate(gs):
            if ps[i].dim() <= 1:
                buf[i] = mom * buf[i] + lr * g
            else:
                wn, gn = ps[i].double().norm().item(), g.double().norm().item()
                local = trust * wn / (gn + wd * wn + eps) if wn > 0 and gn > 0 else 1.0
                buf[i] = mom * buf[i] + (lr * local) * (g + wd * ps[i])
            ps[i] = ps[i] - buf[i]
        traj.append([p.clone() for p in ps])
    return traj


def flat(ts):
    return np.concatenate([t.detach().numpy().astype("<f4").ravel() for t in ts])


def cases(init, grads):
    out = []
    for name, mom, damp, nest, wd in [("sgd_plain", 0.0, 0.0, 0, 0.0),
                                      ("sgd_momentum", 0.9, 0.0, 0, 0.01),
                                      ("sgd_nesterov", 0.9, 0.0, 1, 0.05),
                                      ("sgd_dampening", 0.8, 0.3, 0, 0.0)]:
        lr, mom, damp, wd = f32(0.1), f32(mom), f32(damp), f32(wd)
        tr = run_torch(torch.optim.SGD, init, grads, lr=lr, momentum=mom,
                       dampening=damp, nesterov=bool(nest), weight_decay=wd)
        out.append((name, 0, [lr, mom, damp, nest, wd, 0, 0, 0, 0], tr))
    lr, b1, b2, eps, wd = f32(0.01), f32(0.9), f32(0.999), f32(1e-8), f32(0.1)
    tr = run_torch(torch.optim.AdamW, init, grads, lr=lr, betas=(b1, b2), eps=eps,
                   weight_decay=wd)
    out.append(("adamw", 1, [lr, 0, 0, 0, wd, b1, b2, eps, 0], tr))
    lr, wd, eps = f32(0.02), f32(0.01), f32(1e-6)
    tr = run_lamb(init, grads, lr, b1, b2, eps, wd)
    out.append(("lamb", 2, [lr, 0, 0, 0, wd, b1, b2, eps, 0], tr))
    lr, mom, wd, trust = f32(0.5), f32(0.9), f32(5e-4), f32(0.02)
    tr = run_lars(init, grads, lr, mom, wd, trust, 0.0)
    out.append(("lars", 3, [lr, mom, 0, 0, wd, 0, 0, 0, trust], tr))
    return out


def clip_cases(init, grads):
    out = []
    for max_norm in [0.5, 2.0, 100.0]:
        ps = [p.clone().requires_grad_(True) for p in init]
        for p, g in zip(ps, grads[0]):
            p.grad = g.clone()
        total = torch.nn.utils.clip_grad_norm_(ps, max_norm).item()
        out.append((max_norm, total, flat([p.grad for p in ps])))
    return out


def sched_values(kind, base, warmup, total, step_size, gamma, min_lr, n):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=base)
    if kind == 0:
        return [base] * n
    if kind in (1, 2):
        s = (torch.optim.lr_scheduler.StepLR(opt, step_size=step_size, gamma=gamma)
             if kind == 1 else
             torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total, eta_min=min_lr))
        vals = []
        for _ in range(n):
            vals.append(opt.param_groups[0]["lr"])
            opt.step()
            s.step()
        if kind == 2:  # torch keeps cycling after T_max; dgrad holds min_lr
            vals = [v if i <= total else min_lr for i, v in enumerate(vals)]
        return vals
    vals = []
    for i in range(n):
        if i < warmup:
            vals.append(base * (i + 1) / warmup)
        elif kind == 3:
            vals.append(base)
        else:
            s = min(i - warmup, total - warmup)
            vals.append(min_lr + (base - min_lr) * (1 + math.cos(math.pi * s / (total - warmup))) / 2)
    return vals


SCHEDS = [  # kind, base, warmup, total, step_size, gamma, min_lr, n
    (0, 0.1, 0, 0, 0, 0.0, 0.0, 5),
    (1, 0.1, 0, 0, 3, 0.5, 0.0, 12),
    (2, 0.1, 0, 20, 0, 0.0, 0.001, 25),
    (3, 0.4, 5, 0, 0, 0.0, 0.0, 10),
    (4, 0.4, 5, 30, 0, 0.0, 0.0, 35),
]


def main():
    torch.set_default_dtype(torch.float32)
    init, grads = make_inputs()
    b = bytearray(b"DGOPTFX\0")
    b += struct.pack("<2I", VERSION, len(init))
    for p in init:
        b += struct.pack("<I", p.dim()) + struct.pack("<%dI" % p.dim(), *p.shape)
    b += struct.pack("<I", N_STEPS)
    b += flat(init).tobytes()
    for gs in grads:
        b += flat(gs).tobytes()
    cs = cases(init, grads)
    b += struct.pack("<I", len(cs))
    for name, kind, hyper, traj in cs:
        b += name.encode().ljust(16, b"\0") + struct.pack("<I", kind)
        b += struct.pack("<9f", *hyper)
        for ps in traj:
            b += flat(ps).tobytes()
    cl = clip_cases(init, grads)
    b += struct.pack("<I", len(cl))
    for max_norm, total, g in cl:
        b += struct.pack("<2d", max_norm, total) + g.tobytes()
    b += struct.pack("<I", len(SCHEDS))
    for kind, base, warm, total, ss, gamma, min_lr, n in SCHEDS:
        base, gamma, min_lr = f32(base), f32(gamma), f32(min_lr)
        vals = sched_values(kind, base, warm, total, ss, gamma, min_lr, n)
        b += struct.pack("<If3q2fI", kind, base, warm, total, ss, gamma, min_lr, n)
        b += struct.pack("<%df" % n, *vals)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "wb") as f:
        f.write(bytes(b))
    print("wrote %s (%d bytes)" % (OUT, len(b)))


if __name__ == "__main__":
    main()
