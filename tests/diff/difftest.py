#!/usr/bin/python3
"""Differential test of dgrad against PyTorch 1.13 (run with /usr/bin/python3).

A seeded generator writes random op programs: leaves (parameters, persistent
tensors, per-step data), 3-12 ops drawn from every public op of ops.h plus
dg_to_dtype round trips, with views, broadcasting, a tensor reused in several
ops and in two input slots of one op, zero and odd sizes (0, 1, 3, 17, 129),
non-contiguous inputs; then a loss sum_i sum(out_i * c_i) (or
dg_backward_with(out, c)) and backward. Programs may run several steps on one
context (dg_ctx_reset between, dg_params_zero_grad or accumulation, batch sizes
that change per step, 0 included) with an optimizer (SGD, AdamW, LAMB, LARS),
gradient clipping and an lr schedule. dg_prog (tests/diff/dg_prog.c) runs a
batch of programs in one process; this script replays each in PyTorch from the
same f32 leaf values and compares every op result, every leaf gradient, the
clip norms, the learning rates and the final parameters.

Tolerance rule. dgrad computes in f32; the reference is PyTorch in float64
(`ref`) from the same f32 leaf values. The program is also replayed in
PyTorch float32 (`r32`): that shows how much an honest f32 evaluation of this
very program drifts (much for ill-conditioned programs: cancellation,
layernorm of near-constant rows, Adam on tiny gradients). For each compared
tensor, element-wise:
    |dgrad - ref| <= 1e-6 + 1e-5 * S + 2e-4 * |ref| + 64 * max|r32 - ref|
where S = max|ref| over the tensor, raised for an op result to the largest
|input| of the op, and for a leaf gradient to the largest contribution summed
into the gradient of the leaf or of any tensor computed from it (those sums
may cancel: x used twice, div(y, y), a bias before a layernorm leave f32
noise of the size of the terms, whatever the result).
2e-4 relative is ~3000 f32 ulps: room for 12 ops and for a plain sequential
f32 sum of ~2e4 terms (dgrad's bias-gradient column sums add rows one by
one; 16641 rows reach 1.3e-4, where PyTorch's pairwise sum is far closer).
1e-5 * S absorbs cancellation, whose error is relative to the magnitudes
summed, not to the small result. The r32 term lets dgrad be up to 64x worse
than PyTorch's own f32 run where the program is ill-conditioned (a gradient
that is exactly 0 by an invariance, e.g. a bias before a 2-wide layernorm, is
pure rounding noise in any f32 code, and dgrad's noise may be the larger).
A well-conditioned tensor drifts ~1e-7 * S, so none of this hides an error
of the size of the values. NaN and inf must match exactly. The bugs this is for (a
lost gradient contribution, a stale buffer, a skipped row, a wrong index) are
errors of the size of the values themselves and fail by orders of magnitude.
Optimizer programs are checked step by step (teacher forcing): dg_prog prints
the parameters after every update, and the replay of step s starts from
dgrad's parameters after step s-1 and applies the reference update to dgrad's
own gradients of step s. So every forward, backward and update is compared on
identical inputs, and Adam/LAMB/LARS, which normalise tiny gradients to full
steps, cannot amplify rounding over the steps into a spurious failure.
Kinks are not compared across precisions: a program is skipped as fragile
(and counted) when a (leaky) relu input, a maxpool window's top two values, an
f16/bf16 rounding point, a LARS/LAMB norm tested against 0 or the clip
threshold lies within rounding of its kink (judged from the f64/f32 drift),
or when PyTorch's f32 run overflows where f64 does not.

Failures print the seed, the op and tensor, the max abs/rel error, and (with
--minimise, the default for the first few failures) the program shrunk by a
greedy minimiser (drop loss terms, cut ops into leaves, bypass ops, shrink
sizes, simplify values, drop steps/optimizer), each candidate re-run through
dgrad and PyTorch and kept while it fails the same way.

--random N takes its base seed from DIFFTEST_RANDOM_BASE when set. Exit
status: 0 all passed, 1 a failure, 77 no torch. Last line: "N passed, M failed".

Usage: /usr/bin/python3 tests/diff/difftest.py --prog BUILD/tests/diff/dg_prog
       [--seeds A-B | --seed S --count N] [--random N] [--steps K] [--optim]
       [--threads 2] [--jobs J] [--no-minimise] [--show]
"""
import argparse
import copy
import math
import os
import random
import subprocess
import sys
import tempfile
import time

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    print(f"SKIP: /usr/bin/python3 cannot import torch/numpy ({e})")
    sys.exit(77)

torch.set_num_threads(1)

F32, F16, BF16, I32, I64, F64 = 0, 1, 2, 3, 4, 5
ATOL, ASCALE, RTOL, KCOND = 1e-6, 1e-5, 2e-4, 64.0
LIM = 1e4  # generated values stay below this (no overflow, bounded error)
HERE = os.path.dirname(os.path.abspath(__file__))


def f32(x):
    return float(np.float32(x))


# ---------------------------------------------------------------- programs

class Leaf:
    """kind: param | frozen | pers | data | gdata; vals: one array (all steps)
    or one per step; dtype a dg_dtype code (F32, I32, I64)."""

    def __init__(self, lid, kind, dtype, vals):
        self.id, self.kind, self.dtype, self.vals = lid, kind, dtype, vals

    def val(self, s):
        return self.vals[0] if len(self.vals) == 1 else self.vals[s]


class Op:
    def __init__(self, name, outs, ins, attrs):
        self.name, self.outs, self.ins, self.attrs = name, outs, ins, attrs


class Prog:
    def __init__(self, name):
        self.name = name
        self.steps, self.zero_grad, self.train, self.dump_all = 1, True, True, True
        self.optim = None  # (kind, [args], suffix)
        self.clip = 0.0
        self.sched = None  # (kind, base, warmup, total, step_size, gamma, min_lr)
        self.leaves = {}
        self.ops = []
        self.terms = []  # (tensor id, weight leaf id)
        self.with_grad = False  # dg_backward_with(terms[0]) instead of the sum

    def max_id(self):
        ids = list(self.leaves) + [o for op in self.ops for o in op.outs]
        return max(ids) if ids else -1


def full_ops(p):
    """Body ops plus the loss ops; returns (ops, loss id, grad id or None, dumped ids)."""
    if p.with_grad:
        t, c = p.terms[0]
        return p.ops, t, c, [t]
    ops, nid, total = list(p.ops), p.max_id() + 1, None
    for t, c in p.terms:
        ops.append(Op("mul", [nid], [t, c], []))
        ops.append(Op("sum", [nid + 1], [nid], []))
        s, nid = nid + 1, nid + 2
        if total is not None:
            ops.append(Op("add", [nid], [total, s], []))
            s, nid = nid, nid + 1
        total = s
    return ops, total, None, [t for t, _ in p.terms] + [total]


def num(v):
    return str(int(v)) if float(v).is_integer() and abs(v) < 2**53 else repr(float(v))


def serialize(p):
    out = [f"prog {p.name}", f"steps {p.steps}", f"zero_grad {int(p.zero_grad)}",
           f"train {int(p.train)}", "dump all" if p.dump_all else "dump outs"]
    if p.optim:
        kind, args, suffix = p.optim
        out.append(" ".join(["optim", kind] + [num(a) for a in args] + ([suffix] if suffix else [])))
    if p.clip:
        out.append(f"clip {num(p.clip)}")
    if p.sched:
        out.append("sched " + " ".join(num(a) for a in p.sched))
    for lf in p.leaves.values():
        out.append(f"leaf {lf.id} {lf.kind} {lf.dtype} t{lf.id}{'.bias' if lf.val(0).ndim == 1 else ''}")
        for s, v in enumerate(lf.vals):
            vals = " ".join(num(x) for x in v.ravel().tolist())
            dims = " ".join(str(d) for d in v.shape)
            out.append(f"val {lf.id} {-1 if len(lf.vals) == 1 else s} {v.ndim} {dims} {vals}")
    ops, loss, gid, outs = full_ops(p)
    for op in ops:
        ins = [-1 if i is None else i for i in op.ins]
        out.append(" ".join(["op", op.name, str(len(op.outs))] + [str(o) for o in op.outs] +
                            [str(len(ins))] + [str(i) for i in ins] + [str(len(op.attrs))] +
                            [num(a) for a in op.attrs]))
    out += [f"out {o}" for o in outs]
    out.append(f"backward {loss}" + ("" if gid is None else f" {gid}"))
    out.append("end")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------ torch replay

def attention(qkv, heads, causal, scale):
    B, T, C3 = qkv.shape
    C = C3 // 3
    hd = C // heads
    q, k, v = (t.reshape(B, T, heads, hd).transpose(1, 2) for t in qkv.split(C, dim=-1))
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)
    return (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, C)


def mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)


def to_dtype(x, code, wd):
    x = x.detach()
    if code == F16:
        return x.float().half()
    if code == BF16:
        return x.float().bfloat16()
    if code == F64:
        return x.float().double()
    return x.to(wd)


def t_apply(op, xs, wd, mask=None, kinks=None):
    """Applies one op in PyTorch; returns the list of results. kinks, when a
    dict, receives the inputs of decisions that may flip between precisions."""
    n, a = op.name, op.attrs
    x = xs[0] if xs else None
    if kinks is not None and (n in ("relu", "leaky_relu", "maxpool2d") or (n == "to_dtype" and a[0] in (F16, BF16))):
        kinks[n] = x.detach().double().clone()
    if n == "linear_relu":  # the kink is the pre-activation's sign
        z = F.linear(x, xs[1], xs[2])
        if kinks is not None:
            kinks[n] = z.detach().double().clone()
        return [F.relu(z)]
    if n == "reshape":
        return [x.reshape([int(v) for v in a[1:1 + int(a[0])]])]
    if n == "slice":
        return [x[int(a[0]):int(a[1])]]
    if n == "transpose":
        return [x.transpose(int(a[0]), int(a[1]))]
    if n == "permute":
        return [x.permute(*[int(v) for v in a])]
    if n == "contiguous":
        return [x.contiguous()]
    if n in ("matmul", "matmul_t"):
        l, r = xs[0], xs[1]
        if n == "matmul_t" and a[0]:
            l = l.transpose(-1, -2)
        if n == "matmul_t" and a[1]:
            r = r.transpose(-1, -2)
        return [torch.matmul(l, r)]
    if n == "linear":
        return [F.linear(x, xs[1], xs[2])]
    if n == "linear_add":
        return [xs[3] + F.linear(x, xs[1], xs[2])]
    binops = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}
    if n in binops:
        return [binops[n](x, xs[1])]
    if n == "scale":
        return [x * a[0]]
    if n == "add_scalar":
        return [x + a[0]]
    if n == "sum":
        return [x.sum()]
    if n == "mean":
        return [x.mean()]
    if n in ("sum_dim", "mean_dim"):
        f = torch.sum if n == "sum_dim" else torch.mean
        return [f(x, dim=int(a[0]), keepdim=bool(a[1]))]
    un = {"relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "exp": torch.exp,
          "log": torch.log, "gelu": lambda t: F.gelu(t, approximate="tanh"),
          "softmax": lambda t: torch.softmax(t, -1), "log_softmax": lambda t: torch.log_softmax(t, -1)}
    if n in un:
        return [un[n](x)]
    if n == "cross_entropy":
        C = x.shape[-1]
        return [F.cross_entropy(x.reshape(-1, C), xs[1].reshape(-1).long())]
    if n == "mse":
        return [F.mse_loss(x, xs[1])]
    if n == "layernorm":
        return [F.layer_norm(x, (x.shape[-1],), xs[1], xs[2], a[0])]
    if n == "batchnorm":  # train: batch statistics, no running ones; eval: running (data leaves)
        # torch 1.13's CPU batch_norm backward is wrong when x and the
        # incoming gradient differ in layout: gradient channels-last, x not
        # (a transpose of the output, seed 1772718725), or x channels-last
        # and the gradient not (a permute of the input, seed 991282014: bias
        # gradient [3, -5] where the sums are [0, -2]). Hand it contiguous
        # x and gradient, which changes no value
        y = F.batch_norm(x.contiguous(), xs[3], xs[4], xs[1], xs[2],
                         training=bool(a[0]), eps=a[1])
        if y.requires_grad:
            y.register_hook(lambda g: g.contiguous())
        return [y]
    if n == "embedding":
        return [F.embedding(xs[1].long(), x)]
    if n == "dropout":
        if mask is None:
            return [x]
        # dgrad's dropout selects (a dropped element is 0, forward and
        # backward, even where x or its gradient is inf or NaN); torch
        # multiplies by the mask, so NaN * 0 stays NaN (seed 247546424)
        keep = torch.as_tensor(mask).reshape(x.shape).to(wd) != 0
        return [torch.where(keep, x * f32(np.float32(1) / (np.float32(1) - np.float32(a[0]))),
                            torch.zeros((), dtype=x.dtype))]
    if n == "causal_mask":
        T = x.shape[-1]
        return [x.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf)]
    if n == "conv2d":
        return [F.conv2d(x, xs[1], xs[2], stride=int(a[0]), padding=int(a[1]))]
    if n == "maxpool2d":
        return [F.max_pool2d(x, int(a[0]), int(a[1]))]
    if n == "avgpool2d":
        return [F.avg_pool2d(x, int(a[0]), int(a[1]))]
    if n == "global_avgpool2d":
        return [F.adaptive_avg_pool2d(x, 1).flatten(1)]
    if n == "leaky_relu":
        return [F.leaky_relu(x, a[0])]
    if n == "concat":
        return [torch.cat(xs, int(a[0]))]
    if n == "split":
        return list(torch.split(x, [int(v) for v in a[2:]], int(a[0])))
    if n == "attention":
        return [attention(x, int(a[0]), int(a[1]), a[2])]
    if n == "mlp_gelu":
        return [mlp(*xs[:5])]
    if n == "mlp_gelu_add":
        return [xs[5] + mlp(*xs[:5])]
    if n == "to_dtype":
        return [to_dtype(x, int(a[0]), wd)]
    raise ValueError(f"unknown op {n}")


def sched_lr(s, step):
    """dg_lr_at (optim/schedule.c), as f32."""
    kind, base, warm, total, size, gamma, mn = s

    def cosine(st, tot):
        st = min(st, tot)
        return mn + (base - mn) * (1.0 + math.cos(math.pi * st / tot)) / 2.0
    if kind == 1:
        return f32(base * gamma ** (step // size)) if size > 0 else base
    if kind == 2:
        return f32(cosine(step, total)) if total > 0 else base
    if kind in (3, 4):
        if step < warm:
            return f32(base * (step + 1) / warm)
        if kind == 3 or total <= warm:
            return base
        return f32(cosine(step - warm, total - warm))
    return base


class RefOptim:
    """torch.optim.SGD / AdamW, and LAMB / LARS from the formulas in optim.h
    (torch has neither). Every trainable parameter is stepped every step, with
    a zero gradient where backward did not reach it (dgrad's semantics)."""

    def __init__(self, p, params, names):
        self.kind, self.args, self.suffix = p.optim
        self.params, self.names, self.t, self.state = params, names, 0, {}
        a = self.args
        self.lr = a[0]
        self.torch = None
        if params and self.kind == "sgd":
            self.torch = torch.optim.SGD(params, lr=a[0], momentum=a[1], dampening=a[2],
                                         nesterov=bool(a[3]), weight_decay=a[4])
        elif params and self.kind == "adamw":
            self.torch = torch.optim.AdamW(params, lr=a[0], betas=(a[1], a[2]), eps=a[3],
                                           weight_decay=a[4])

    def set_lr(self, lr):
        self.lr = lr
        if self.torch:
            for g in self.torch.param_groups:
                g["lr"] = lr

    def kink(self, name, k, v):
        """Records a norm whose zero test (a discontinuity) decides the update."""
        self.kinks[(name, self.t, k)] = ("norm", torch.tensor([float(v)]), ())

    @torch.no_grad()
    def step(self, kinks):
        self.t += 1
        self.kinks = kinks
        for q in self.params:
            if q.grad is None:
                q.grad = torch.zeros_like(q)
        if self.torch:
            self.torch.step()
        elif self.kind == "lamb":
            self.lamb()
        elif self.kind == "lars":
            self.lars()

    def lamb(self):
        _, b1, b2, eps, wd = self.args[:5]
        for k, q in enumerate(self.params):
            m, v = self.state.setdefault(id(q), (torch.zeros_like(q), torch.zeros_like(q)))
            g = q.grad
            m.mul_(b1).add_((1 - b1) * g)
            v.mul_(b2).add_((1 - b2) * g * g)
            r = (m / (1 - b1 ** self.t)) / ((v / (1 - b2 ** self.t)).sqrt() + eps) + wd * q
            wn, rn = float(q.double().norm()), float(r.double().norm())
            self.kink("lamb_w", k, wn)
            self.kink("lamb_r", k, rn)
            q.sub_(self.lr * (wn / rn if wn > 0 and rn > 0 else 1.0) * r)

    def lars(self):
        _, mom, wd, trust, eps, adapt = self.args[:6]
        for k, (q, name) in enumerate(zip(self.params, self.names)):
            buf = self.state.setdefault(id(q), torch.zeros_like(q))
            g = q.grad
            if (q.dim() <= 1 and not adapt) or (self.suffix and name.endswith(self.suffix)):
                buf.mul_(mom).add_(self.lr * g)
            else:
                wn, gn = float(q.double().norm()), float(g.double().norm())
                self.kink("lars_w", k, wn)
                self.kink("lars_g", k, gn)
                local = trust * wn / (gn + wd * wn + eps) if wn > 0 and gn > 0 else 1.0
                buf.mul_(mom).add_(self.lr * local * (g + wd * q))
            q.sub_(buf)


def leaf_name(lf):
    return f"t{lf.id}{'.bias' if lf.val(0).ndim == 1 else ''}"


def leaf_tensor(lf, s, wd):
    v = lf.val(s)
    if lf.dtype in (I32, I64):
        return torch.tensor(v, dtype=torch.long)
    t = torch.tensor(v, dtype=wd)
    if lf.kind in ("param", "pers", "gdata"):
        t.requires_grad_(True)
    return t


def amax(t):
    t = t.detach()
    if t.numel() == 0:
        return 0.0
    v = float(t.abs().max())
    if math.isfinite(v):
        return v
    t = t.double().abs()
    return float(t[torch.isfinite(t)].max()) if bool(torch.isfinite(t).any()) else 0.0


def forward(p, ops, env, s, wd, masks, res, scales):
    """Runs the ops of step s into env; records results, kinks and error
    scales. Returns {tensor id: [one copy per input slot it fills]}: their
    gradients are the separate contributions summed into its gradient."""
    slots = {}

    def arg(i):
        x = None if i is None else env[i]
        if scales and x is not None and x.requires_grad:
            x = x * 1.0  # exact; not a view (torch 1.13 cannot retain a split view's grad)
            x.retain_grad()
            slots.setdefault(i, []).append(x)
        return x
    for k, op in enumerate(ops):
        kk = {}
        xs = [arg(i) for i in op.ins]
        ys = t_apply(op, xs, wd, masks.get((s, op.outs[0])), kk)
        if kk:
            res["K"][(k, s)] = (op.name, kk[op.name], op.attrs)
        xmax = max((amax(x) for x in xs if x is not None and x.is_floating_point()),
                   default=0.0) if scales else 0.0
        for o, y in zip(op.outs, ys):
            env[o] = y
            if scales:
                res["S"][("F", s, o)] = max(xmax, amax(y))
            if p.dump_all:
                res["F"][(s, o)] = y.detach().double().numpy().copy()
    return slots


def downstream(ops):
    """{tensor id: ids of every op result computed from it}."""
    down = {}
    for op in reversed(ops):
        reach = set(op.outs).union(*(down.get(o, ()) for o in op.outs))
        for i in op.ins:
            if i is not None:
                down.setdefault(i, set()).update(reach)
    return down


def grad_scales(p, ops, slots, s, res):
    """Error scale of each leaf gradient: the largest contribution summed into
    the gradient of the leaf or of any tensor computed from it. Sums of those
    may cancel (x used twice, div(y, y), a bias before a layernorm) and leave
    f32 noise of the size of the terms, whatever the result."""
    contrib = {i: max((amax(a.grad) for a in sl if a.grad is not None), default=0.0)
               for i, sl in slots.items()}
    down = downstream(ops)
    for lf in p.leaves.values():
        ids = {lf.id} | down.get(lf.id, set())
        res["S"][("G", s, lf.id)] = max((contrib.get(i, 0.0) for i in ids), default=0.0)


def backward(p, env, s, loss_id, gid, res):
    loss = env[loss_id]
    loss.backward(env[gid] if gid is not None else torch.ones_like(loss))
    for lf in p.leaves.values():
        t = env[lf.id]
        if torch.is_tensor(t) and t.grad is not None:
            t.grad = t.grad.clone()  # AccumulateGrad may hand two leaves one buffer
        if lf.kind in ("param", "pers", "gdata") and lf.dtype == F32:
            res["G"][(s, lf.id)] = None if t.grad is None else t.grad.double().numpy().copy()


@torch.no_grad()
def update(p, s, trainable, keep, opt, res, dg):
    """Clipping and the optimizer step. With dgrad's output dg, the step
    starts from dgrad's gradients (its parameters were loaded before the
    forward), so each update is checked on its own."""
    params = [keep[lf.id] for lf in trainable]
    if dg is not None and opt:
        for lf, q in zip(trainable, params):
            g = dg["G"].get((s, lf.id))
            q.grad = torch.zeros_like(q) if g is None else torch.tensor(g, dtype=q.dtype).reshape(q.shape)
    if p.clip:
        gs = [q.grad if q.grad is not None else torch.zeros_like(q) for q in params]
        total = math.sqrt(sum(float((g.double() ** 2).sum()) for g in gs))
        res["N"][s] = total
        res["K"][("clip", s)] = ("norm", torch.tensor([total + 1e-6 - p.clip]), ())
        coef = p.clip / (total + 1e-6)
        for q in params:
            if q.grad is not None and coef < 1:
                q.grad.mul_(coef)
    if opt:
        opt.step(res["K"])
        for lf, q in zip(trainable, params):
            res["P"][(s, lf.id)] = q.double().numpy().copy()


def replay(p, wd, masks, dg=None):
    """Runs p in PyTorch with working dtype wd; returns the dgrad-shaped result
    dict plus 'K' (kink inputs), 'S' (error scales) and 'env' (all values)."""
    ops, loss_id, gid, outs = full_ops(p)
    keep = {lf.id: leaf_tensor(lf, 0, wd) for lf in p.leaves.values()
            if lf.kind in ("param", "frozen", "pers")}
    trainable = [lf for lf in p.leaves.values() if lf.kind == "param"]
    params = [keep[lf.id] for lf in trainable]
    opt = RefOptim(p, params, [leaf_name(lf) for lf in trainable]) if p.optim else None
    res = {"F": {}, "G": {}, "P": {}, "N": {}, "L": {}, "W": {}, "K": {}, "S": {}, "env": []}
    scales = wd == torch.float64  # error scales come from the reference run
    for s in range(p.steps):
        if p.zero_grad:
            for q in params:
                q.grad = None
        if dg is not None and opt and s > 0:
            with torch.no_grad():  # from dgrad's parameters after its previous update
                for lf, q in zip(trainable, params):
                    if (s - 1, lf.id) in dg["P"]:
                        q.copy_(torch.tensor(dg["P"][(s - 1, lf.id)], dtype=wd).reshape(q.shape))
        if p.sched and opt:
            opt.set_lr(sched_lr(p.sched, s))
            res["L"][s] = opt.lr
        env = {i: keep[i] if i in keep else leaf_tensor(lf, s, wd) for i, lf in p.leaves.items()}
        slots = forward(p, ops, env, s, wd, masks, res, scales)
        if not p.dump_all:
            for o in outs:
                res["F"][(s, o)] = env[o].detach().double().numpy().copy()
        backward(p, env, s, loss_id, gid, res)
        if scales:
            grad_scales(p, ops, slots, s, res)
        update(p, s, trainable, keep, opt, res, dg)
        res["env"].append({i: (t.detach().double().numpy() if torch.is_tensor(t) else t)
                           for i, t in env.items()})
    for lf in p.leaves.values():
        if lf.kind in ("param", "frozen"):
            res["W"][lf.id] = keep[lf.id].detach().double().numpy().copy()
    return res


# ------------------------------------------------------- dgrad side (dg_prog)

def parse_tensor(toks):
    nd = int(toks[0])
    shape = tuple(int(t) for t in toks[1:1 + nd])
    vals = np.array(toks[2 + nd:], dtype=np.float64)
    return vals.reshape(shape)


def parse_output(text):
    """dg_prog's output by program; a program cut short (a crash mid-line)
    lacks "done"."""
    progs, cur = {}, None
    for line in text.splitlines():
        try:
            cur = parse_line(line, progs, cur)
        except (ValueError, IndexError):
            if cur is not None:
                cur["done"] = False
            break
    return progs


def parse_line(line, progs, cur):
    if True:
        tag, _, rest = line.partition(" ")
        t = rest.split()
        if tag == "prog":
            cur = {"F": {}, "G": {}, "P": {}, "W": {}, "N": {}, "L": {}, "M": {}, "E": None, "done": False}
            progs[rest] = cur
        elif cur is None:
            return cur
        elif tag in ("F", "G", "P"):
            key = (int(t[0]), int(t[1]))
            cur[tag][key] = None if t[2] == "none" else parse_tensor(t[2:])
        elif tag == "W":
            cur["W"][int(t[0])] = parse_tensor(t[1:])
        elif tag in ("N", "L"):
            cur[tag][int(t[0])] = float(t[1])
        elif tag == "M":
            bits = t[2] if t[2] != "-" else ""
            cur["M"][(int(t[0]), int(t[1]))] = np.frombuffer(bits.encode(), dtype=np.uint8) - 48
        elif tag == "E":
            cur["E"] = rest
        elif tag == "done":
            cur["done"] = True
    return cur


class Runner:
    def __init__(self, prog, threads):
        self.prog = prog
        self.env = dict(os.environ)
        if threads:
            self.env["DG_NUM_THREADS"] = str(threads)

    def run_text(self, text, timeout=600):
        with tempfile.NamedTemporaryFile("w", suffix=".dgp", delete=False) as f:
            f.write(text)
            path = f.name
        try:
            r = subprocess.run([self.prog, path], env=self.env, capture_output=True, text=True,
                               timeout=timeout)
            return r.returncode, r.stdout, r.stderr
        except subprocess.TimeoutExpired as e:
            return -999, e.stdout or "", "timeout"
        finally:
            os.unlink(path)

    def run(self, progs):
        """dgrad outputs by program name. A crash is attributed to the first
        program without "done" and the rest rerun in a new batch; a bad exit
        status after every program finished (a sanitizer's leak report) is
        attributed by running the programs one by one."""
        outs, todo = {}, list(progs)
        while todo:
            rc, so, se = self.run_text("".join(serialize(p) for p in todo))
            got = parse_output(so)
            rest = []
            for i, p in enumerate(todo):
                o = got.get(p.name)
                if o and o["done"]:
                    outs[p.name] = o
                    continue
                outs[p.name] = {"crash": f"exit {rc}: {se.strip()[-3000:]}"}
                rest = todo[i + 1:]
                break
            else:
                if rc != 0:
                    for p in (todo if len(todo) > 1 else ()):
                        if self.run_text(serialize(p))[0] != 0:
                            outs[p.name] = {"crash": f"exit {rc} after the program: {se.strip()[-3000:]}"}
                    if len(todo) == 1:
                        outs[todo[0].name] = {"crash": f"exit {rc} after the program: {se.strip()[-3000:]}"}
            todo = rest
        return outs


# ------------------------------------------------------------- comparing

def kink_fragile(k64, k32):
    """True when a relu sign, maxpool argmax or f16/bf16 rounding may differ
    between an f32 and an f64 evaluation of this program."""
    for key, (name, x64, a) in k64.items():
        if key not in k32:
            return True
        x32 = k32[key][1]
        if x64.numel() == 0:
            continue
        dev = float((x32 - x64).abs().max())
        if not math.isfinite(dev):
            return True
        thr = 1e-5 * float(x64.abs().max()) + 32 * dev
        if name in ("relu", "leaky_relu", "linear_relu", "norm"):  # a sign / a zero test
            if bool((((x64 > 0) != (x32 > 0)) | ((x64 != 0) & (x64.abs() < thr))).any()):
                return True
        elif name == "maxpool2d":
            if maxpool_fragile(x64, x32, int(a[0]), int(a[1]), thr):
                return True
        else:  # to_dtype to f16 / bf16: x +- its possible error must round alike
            d = 32 * dev + 2e-6 * x64.abs()
            code = int(a[0])
            if not torch.equal(to_dtype(x64 - d, code, torch.float64),
                               to_dtype(x64 + d, code, torch.float64)):
                return True
    return False


def f32_overflow(ref, r32):
    for tag in ("F", "G", "W"):
        for key, r in ref[tag].items():
            q = r32[tag].get(key)
            if r is not None and q is not None and r.shape == q.shape and \
                    bool((np.isfinite(r) & ~np.isfinite(q)).any()):
                return True
    return False


def maxpool_fragile(x64, x32, k, s, thr):
    N, C, H, W = x64.shape
    if N * C == 0 or k * k == 1:
        return False

    def cols(x):
        return F.unfold(x.reshape(N * C, 1, H, W), k, stride=s)  # (NC, k*k, L)
    c64, c32 = cols(x64), cols(x32)
    top = c64.topk(2, dim=1).values
    gap = top[:, 0] - top[:, 1]
    if bool(((gap != 0) & (gap < thr)).any()):
        return True
    return not torch.equal(c64.argmax(1), c32.argmax(1))


def cmp_tensor(got, ref, r32, scale=0.0):
    """None when got matches ref under the tolerance rule, else a description.
    scale: a magnitude the absolute error may be relative to besides max|ref|
    (the op's inputs; a gradient's separate contributions, which may cancel)."""
    if got is None or ref is None:
        other = ref if got is None else got
        if other is None or not np.any(other):
            return None
        return "gradient missing on one side"
    if got.shape != ref.shape:
        return f"shape {got.shape} vs reference {ref.shape}"
    if got.size == 0:
        return None
    nan_g, nan_r = np.isnan(got), np.isnan(ref)
    fin = np.isfinite(ref)
    if not np.array_equal(nan_g, nan_r) or not np.array_equal(got[~fin & ~nan_r], ref[~fin & ~nan_r]):
        return "NaN/inf pattern differs"
    dev = 0.0
    if r32 is not None and r32.shape == ref.shape:
        ok32 = fin & np.isfinite(r32)
        dev = float(np.max(np.abs(r32[ok32] - ref[ok32]), initial=0.0))
    scale = max(scale, float(np.max(np.abs(ref[fin]), initial=0.0)))
    err = np.zeros(ref.shape)
    err[fin] = np.abs(got[fin] - ref[fin])
    allow = ATOL + ASCALE * scale + RTOL * np.abs(ref) + KCOND * dev
    if not np.isfinite(got[fin]).all():
        return "non-finite where the reference is finite"
    bad = err > allow
    if not bad.any():
        return None
    i = int(np.argmax(np.where(bad, err / allow, 0)))
    rel = np.max(err / np.maximum(np.abs(ref), 1e-300))
    return (f"max abs err {float(err.max()):.3g}, max rel err {float(rel):.3g}, worst at flat "
            f"index {i}: dgrad {got.ravel()[i]:.9g} vs torch {ref.ravel()[i]:.9g} "
            f"(allowed {allow.ravel()[i]:.3g}, f32-torch drift {dev:.3g})")


def producer(p, tid):
    ops, _, _, _ = full_ops(p)
    for op in ops:
        if tid in op.outs:
            return op.name
    lf = p.leaves.get(tid)
    return f"leaf {lf.kind}" if lf else "?"


def check(p, out):
    """(status, detail): status pass | fragile | fail:<kind>."""
    if "crash" in out:
        return "fail:crash", "dg_prog died: " + out["crash"]
    try:
        ref = replay(p, torch.float64, out["M"], out)
        r32 = replay(p, torch.float32, out["M"], out)
    except Exception as e:  # the generator made a program torch rejects
        if out["E"]:
            return "invalid", f"torch: {e}; dgrad: {out['E']}"
        return "fail:harness", f"PyTorch replay raised: {type(e).__name__}: {e}"
    if out["E"]:
        code = out["E"].split()[1] if len(out["E"].split()) > 1 else "?"
        return f"fail:error:{code}", f"dgrad error on a valid program: {out['E']}"
    if kink_fragile(ref["K"], r32["K"]) or f32_overflow(ref, r32):
        return "fragile", "a relu/maxpool/rounding decision is within rounding of its kink"
    what = {"F": "forward value", "G": "gradient", "N": "clip norm", "L": "lr",
            "P": "updated parameter", "W": "final parameter"}
    keys = []  # in program order: step by step (lr, forward, gradient, clip norm), then the parameters
    for tag in what:
        for key in set(ref[tag]) | set(out[tag]):
            step = key[0] if isinstance(key, tuple) else p.steps if tag == "W" else key
            keys.append((step, "LFGNPW".index(tag), str(key), tag, key))
    for step, _, _, tag, key in sorted(keys):
        if key not in out[tag]:
            if tag == "G" and (ref[tag][key] is None or not np.any(ref[tag][key])):
                continue
            return "fail:missing", f"{what[tag]} {key} missing from dg_prog's output"
        if key not in ref[tag]:
            return "fail:extra", f"{what[tag]} {key} printed by dg_prog but not by the replay"
        g, r, q = (np.asarray(d[tag][key]) if d[tag][key] is not None else None for d in (out, ref, r32))
        sk = (tag,) + key if tag in ("F", "G") else None
        msg = cmp_tensor(g, r, q, ref["S"].get(sk, 0.0))
        if msg:
            if tag in ("F", "G", "P"):
                where = f"tensor {key[1]} ({producer(p, key[1])}) at step {key[0]}"
            else:
                where = f"at step {key}" if tag in ("N", "L") else f"tensor {key} ({producer(p, key)})"
            return f"fail:mismatch:{tag}", f"{what[tag]} {where}: {msg}"
    return "pass", ""


# --------------------------------------------------------------- generator

class TooBig(Exception):
    pass


class TI:
    """A tensor while generating: per-step shapes and f64 values."""

    def __init__(self, shapes, dtype, rg, vals, leaf):
        self.shapes, self.dtype, self.rg, self.vals, self.leaf = shapes, dtype, rg, vals, leaf
        self.nd = len(shapes[0])
        self.uses, self.hidden = 0, False

    def fixed(self, d):
        return all(sh[d] == self.shapes[0][d] for sh in self.shapes)

    def allfixed(self):
        return all(sh == self.shapes[0] for sh in self.shapes)

    def dim(self, d):
        return self.shapes[0][d]

    def min_numel(self):
        return min(math.prod(sh) for sh in self.shapes)

    def maxabs(self):
        return max((float(v.abs().max()) for v in self.vals if v.numel()), default=0.0)

    def minval(self):
        return min((float(v.min()) for v in self.vals if v.numel()), default=math.inf)

    def minabs(self):
        return min((float(v.abs().min()) for v in self.vals if v.numel()), default=math.inf)


def static_fragile(name, xs, a):
    """Generation-time kink check (f64 values only)."""
    x = xs[0]
    if name == "linear_relu":
        x = F.linear(x, xs[1], xs[2]) if x is not None else None
        name = "relu"
    if x is None or x.numel() == 0:
        return False
    scale = float(x.abs().max())
    if name in ("relu", "leaky_relu"):
        return bool(((x != 0) & (x.abs() < 1e-4 * scale)).any())
    if name == "maxpool2d":
        return maxpool_fragile(x, x, int(a[0]), int(a[1]), 1e-4 * scale)
    if name == "to_dtype" and int(a[0]) in (F16, BF16):
        d = 2e-5 * x.abs() + 1e-9
        return not torch.equal(to_dtype(x - d, int(a[0]), torch.float64),
                               to_dtype(x + d, int(a[0]), torch.float64))
    return False


class Gen:
    """Builds one random valid program; every op is evaluated in float64 as it
    is added (bounded, finite, away from kinks, and PyTorch accepts it)."""

    def __init__(self, seed, mode):
        self.r = random.Random(seed)
        self.r_fused = random.Random(seed ^ 0x5EED1)
        self.np = np.random.RandomState(self.r.getrandbits(32))
        self.steps = mode["steps"]
        self.p = Prog(f"s{seed}")
        self.p.steps = self.steps
        self.T, self.nid, self.mode = {}, 0, mode
        self.big = mode["threads"] > 1 and self.r.random() < 0.7
        self.budget = 70000 if self.big else 400
        if self.steps > 1:
            self.B = [self.r.choice([0, 1, 2, 3, 5]) for _ in range(self.steps)]
            if self.r.random() < 0.6:
                self.B[self.r.randrange(1, self.steps)] = 0
            if not any(self.B):
                self.B[0] = 3
        else:
            self.B = [self.rdim()]

    # ---- sizes and values
    def rdim(self, zero=True, big_ok=True):
        r = self.r.random()
        if zero and r < 0.08:
            return 0
        if self.big and big_ok and r < 0.4:
            return self.r.choice([129, 257, 300])
        if r < 0.15:
            return 17
        if r < 0.18 and big_ok:
            return 129
        return self.r.choice([1, 1, 2, 3, 3, 4, 5])

    def rshape(self, nd=None, zero=True):
        nd = self.r.choice([0, 1, 1, 2, 2, 2, 3, 3, 4]) if nd is None else nd
        sh = [self.rdim(zero) for _ in range(nd)]
        while math.prod(sh) * max(self.B + [1]) > self.budget:
            sh[sh.index(max(sh))] = self.r.choice([1, 2, 3, 5])
        return tuple(sh)

    def rshapes(self, nd=None, zero=True):
        sh = self.rshape(nd, zero)
        if sh and self.r.random() < 0.35:
            return [(b,) + sh[1:] for b in self.B]
        return [sh] * self.steps

    def values(self, shape, style=None):
        style = style or self.r.choice("uuunnnwiid")
        n = math.prod(shape)
        g = self.np
        if style == "u":
            v = g.uniform(-1, 1, n)
        elif style == "n":
            v = g.normal(0, 1, n)
        elif style == "w":
            v = g.uniform(-3, 3, n)
        elif style == "i":
            v = g.randint(-2, 3, n)
        elif style == "d":  # few distinct values: ties
            v = g.choice([-1.0, 0.5, 2.0], n)
        elif style == "var":  # a variance
            v = g.uniform(0.25, 2, n)
        elif style == "pos":  # safe denominators
            v = g.uniform(0.5, 2, n) * g.choice([-1, 1], n)
        else:
            raise ValueError(style)
        return np.float32(v).astype(np.float64).reshape(shape)

    # ---- tensors
    def new_id(self):
        self.nid += 1
        return self.nid - 1

    def kind(self, varying):
        r = self.r.random()
        if varying:
            return "gdata" if r < 0.4 else "data"
        if r < 0.5:
            return "frozen" if self.mode["optim"] and self.r.random() < 0.1 else "param"
        return "pers" if r < 0.6 else "gdata" if r < 0.75 else "data"

    def leaf(self, shapes, kind=None, style=None, dtype=F32, irange=None):
        if not isinstance(shapes, list):
            shapes = [tuple(shapes)] * self.steps
        if max(math.prod(sh) for sh in shapes) > 3 * self.budget:
            raise TooBig()
        varying = any(sh != shapes[0] for sh in shapes)
        kind = kind or self.kind(varying)
        if kind in ("param", "frozen", "pers") and varying:
            kind = "gdata"
        per = shapes if kind in ("data", "gdata") and self.steps > 1 else shapes[:1]
        if dtype == F32:
            vals = [self.values(sh, style) for sh in per]
        else:
            vals = [self.np.randint(0, irange, math.prod(sh)).reshape(sh).astype(np.int64) for sh in per]
        i = self.new_id()
        self.p.leaves[i] = Leaf(i, kind, dtype, vals)
        tv = [torch.tensor(vals[0] if len(vals) == 1 else vals[s]) for s in range(self.steps)]
        self.T[i] = TI(shapes, dtype, kind in ("param", "pers", "gdata") and dtype == F32, tv, True)
        return i

    def pool(self, pred):
        return [i for i, t in self.T.items() if not t.hidden and t.dtype == F32 and pred(t)]

    def pick(self, pred, make, p_new=0.3):
        c = self.pool(pred)
        if not c or self.r.random() < p_new:
            return make()
        w = [(4 if self.T[i].uses == 0 else 1) * (2 if self.T[i].rg else 1) for i in c]
        return self.r.choices(c, w)[0]

    def snapshot(self):
        return self.nid, len(self.p.ops)

    def rollback(self, snap):
        nid, nops = snap
        for i in range(nid, self.nid):
            self.T.pop(i, None)
            self.p.leaves.pop(i, None)
        for op in self.p.ops[nops:]:
            for i in op.ins:
                if i is not None and i in self.T:
                    self.T[i].uses -= 1
        del self.p.ops[nops:]
        self.nid = nid

    def emit(self, name, ins, attrs=(), nout=1, hide=False):
        """Adds op name(ins, attrs) if it is valid and well-behaved on every
        step; returns its output id (list for split) or None."""
        op = Op(name, [], list(ins), [float(a) for a in attrs])
        per = []
        for s in range(self.steps):
            xs = [None if i is None else self.T[i].vals[s] for i in ins]
            mask = None
            if name == "dropout" and self.p.train and attrs[0] > 0:
                mask = torch.from_numpy(np.asarray(self.np.uniform(0, 1, tuple(xs[0].shape)) >= float(attrs[0])))
            if static_fragile(name, xs, op.attrs):
                return None
            try:
                ys = t_apply(op, xs, torch.float64, mask)
            except (RuntimeError, ValueError, IndexError):
                return None
            for y in ys:
                if y.dim() > 4 or y.numel() > 3 * self.budget:
                    return None
                if y.is_floating_point() and y.numel():
                    v = y.double()
                    bad = ~torch.isfinite(v) if name != "causal_mask" else torch.isnan(v)
                    if bool(bad.any()) or float(v[torch.isfinite(v)].abs().max(), ) > LIM:
                        return None
            per.append(ys)
        if name == "to_dtype":
            rg = False
        elif name in ("cross_entropy", "embedding"):
            rg = self.T[ins[0]].rg
        else:
            rg = any(self.T[i].rg for i in ins if i is not None)
        for i in ins:
            if i is not None:
                self.T[i].uses += 1
        for k in range(len(per[0])):
            o = self.new_id()
            y0 = per[0][k]
            dt = {torch.float16: F16, torch.bfloat16: BF16}.get(y0.dtype, F64 if name == "to_dtype" and attrs[0] == F64 else F32)
            t = TI([tuple(ys[k].shape) for ys in per], dt, rg, [ys[k] for ys in per], False)
            t.hidden = hide
            self.T[o] = t
            op.outs.append(o)
        self.p.ops.append(op)
        return op.outs if nout > 1 else op.outs[0]

    def any_x(self, nd_ok=lambda nd: True):
        def make():
            nds = [n for n in range(5) if nd_ok(n)]
            return self.leaf(self.rshapes(self.r.choice(nds)))
        return self.pick(lambda t: nd_ok(t.nd), make)

    def like(self, shapes, style=None):
        """A new leaf or an existing tensor with exactly these per-step shapes."""
        c = self.pool(lambda t: t.shapes == shapes)
        if c and self.r.random() < 0.3:
            return self.r.choice(c)
        return self.leaf(list(shapes), style=style)

    def small(self, zero=True):
        return self.r.choice([0, 1, 2, 3, 5] if zero else [1, 2, 3, 5])

    # ---- op generators: each adds one op (plus any helper ops) or returns None
    def factor(self, n, nd):
        dims = []
        for _ in range(nd - 1):
            ds = [d for d in range(1, min(n, 300) + 1) if n % d == 0] if n else [0, 1, 2, 3]
            d = self.r.choice(ds)
            dims.append(d)
            n = n // d if d else n
        return dims + [n]

    def g_reshape(self):
        x = self.any_x()
        t = self.T[x]
        if t.allfixed():
            n = math.prod(t.shapes[0])
            nd = 0 if n == 1 and self.r.random() < 0.3 else self.r.randint(1, 4)
            dims = self.factor(n, nd) if n else [self.small() for _ in range(nd - 1)] + [0]
            self.r.shuffle(dims)
            known = [d for d in dims]
            if dims and self.r.random() < 0.3:
                k = self.r.randrange(len(dims))
                if math.prod(dims[:k] + dims[k + 1:]) > 0:
                    known[k] = -1
            dims = known
        elif t.nd >= 1 and all(t.fixed(d) for d in range(1, t.nd)):
            rest = math.prod(t.shapes[0][1:])
            if rest == 0:
                return None
            dims = [-1] + self.factor(rest, self.r.randint(0, 3)) if self.r.random() < 0.7 else [-1]
            if dims[1:] == [1]:
                dims = dims[:1] + [1]
        else:
            return None
        return self.emit("reshape", [x], [len(dims)] + dims)

    def g_slice(self):
        x = self.any_x(lambda nd: nd >= 1)
        m = min(sh[0] for sh in self.T[x].shapes)
        a = self.r.randint(0, m)
        return self.emit("slice", [x], [a, self.r.randint(a, m)])

    def g_transpose(self):
        x = self.any_x(lambda nd: nd >= 1)
        nd = self.T[x].nd
        return self.emit("transpose", [x], [self.r.randrange(-nd, nd), self.r.randrange(-nd, nd)])

    def g_permute(self):
        x = self.any_x(lambda nd: nd >= 1)
        perm = list(range(self.T[x].nd))
        self.r.shuffle(perm)
        return self.emit("permute", [x], perm)

    def g_contiguous(self):
        x = self.any_x(lambda nd: nd >= 2)
        if self.r.random() < 0.7:  # a non-contiguous view first
            nd = self.T[x].nd
            x = self.emit("transpose", [x], [0, nd - 1])
        return x is not None and self.emit("contiguous", [x])

    def g_matmul(self):
        kind = self.r.choice(["2", "3", "32"])
        tr = self.r.random() < 0.5
        ta, tb = (self.r.random() < 0.5, self.r.random() < 0.5) if tr else (False, False)
        nda = 2 if kind == "2" else 3
        inner = (nda - 2, nda - 1)

        def make():
            rows = self.rshape(2)
            if nda == 3:
                b0 = self.small() if self.r.random() < 0.5 else None
                return self.leaf([((b if b0 is None else b0),) + rows for b in self.B])
            return self.leaf(rows)
        a = self.pick(lambda t: t.nd == nda and t.fixed(inner[0]) and t.fixed(inner[1]), make)
        ta_ = self.T[a]
        K = ta_.dim(inner[0]) if ta else ta_.dim(inner[1])
        if self.r.random() < 0.2:
            b = a  # one tensor in both slots: a @ a^T, a^T @ a, ...
        else:
            N = self.rdim()
            raw = (N, K) if tb else (K, N)
            if kind == "3":
                b = self.leaf([(sh[0],) + raw for sh in ta_.shapes])
            else:
                b = self.pick(lambda t: t.nd == 2 and t.allfixed() and t.shapes[0] == raw,
                              lambda: self.leaf(raw), 0.6)
        if tr:
            return self.emit("matmul_t", [a, b], [int(ta), int(tb)])
        return self.emit("matmul", [a, b])

    def g_linear(self, add=False):
        def make():
            sh = self.rshapes(self.r.randint(1, 3))
            last = 0 if self.r.random() < 0.15 else sh[0][-1]
            return self.leaf([s[:-1] + (last,) for s in sh])
        x = self.pick(lambda t: t.nd >= 1 and t.fixed(t.nd - 1), make)
        tx = self.T[x]
        I = tx.dim(-1)
        O = I if add and self.r.random() < 0.5 else self.rdim()
        if self.r.random() < 0.15 and tx.nd == 2 and tx.allfixed():
            w, O = x, tx.dim(0)  # linear(x, x) = x x^T
        else:
            w = self.pick(lambda t: t.nd == 2 and t.allfixed() and t.dim(1) == I and t.dim(0) == O,
                          lambda: self.leaf((O, I)), 0.7)
        b = None if self.r.random() < 0.3 else self.pick(
            lambda t: t.nd == 1 and t.allfixed() and t.dim(0) == O, lambda: self.leaf((O,)), 0.7)
        if not add:
            # the fused ReLU is drawn from a stream of its own, so the main
            # stream's draws stay as they were; a linear that becomes
            # linear_relu still changes values, and what later draws accept
            return self.emit("linear_relu" if self.r_fused.random() < 0.3 else "linear", [x, w, b])
        oshapes = [sh[:-1] + (O,) for sh in tx.shapes]
        res = self.residual(x, oshapes)
        return res is not None and self.emit("linear_add", [x, w, b, res])

    def residual(self, x, oshapes):
        """res for the fused residual ops: x itself or dg_contiguous(x) when the
        shapes allow (two input slots, one tensor), else another tensor."""
        r = self.r.random()
        if self.T[x].shapes == oshapes and r < 0.5:
            return x if r < 0.35 else self.emit("contiguous", [x])
        return self.like(oshapes)

    def bshapes(self, shapes):
        """Per-step shapes broadcasting against shapes (same rule every step)."""
        nd = len(shapes[0])
        k = self.r.randint(0, nd)
        ones = [self.r.random() < 0.3 for _ in range(k)]
        lead = self.r.random() < 0.15 and nd < 4
        ld = self.r.choice([1, 2, 3])
        out = []
        for sh in shapes:
            tail = tuple(1 if o else d for o, d in zip(ones, sh[nd - k:]))
            out.append(((ld,) if lead else ()) + tail)
        return out

    def g_binary(self):
        name = self.r.choice(["add", "sub", "mul", "div"])
        a = self.any_x()
        ta = self.T[a]
        r = self.r.random()
        if r < 0.15:
            b = a
        elif r < 0.7:
            b = self.leaf(self.bshapes(ta.shapes), style="pos" if name == "div" else None)
        else:
            def ok(t):
                try:
                    return all(len(np.broadcast_shapes(x, y)) <= 4 for x, y in zip(ta.shapes, t.shapes))
                except ValueError:
                    return False
            c = self.pool(ok)
            if not c:
                return None
            b = self.r.choice(c)
        if name != "div" and self.r.random() < 0.5:
            a, b = b, a
        if name == "div" and self.T[b].minabs() < 0.3:
            return None
        return self.emit(name, [a, b])

    def g_scale(self):
        s = f32(self.r.choice([0.0, 1.0, -1.0, self.r.uniform(-2, 2)]))
        return self.emit(self.r.choice(["scale", "add_scalar"]), [self.any_x()], [s])

    def g_reduce(self):
        name = self.r.choice(["sum", "mean", "sum_dim", "mean_dim"])
        x = self.any_x(lambda nd: nd >= 1 or name in ("sum", "mean"))
        t = self.T[x]
        if name == "sum":
            return self.emit(name, [x])
        if name == "mean":
            return t.min_numel() > 0 and self.emit(name, [x])
        d = self.r.randrange(-t.nd, t.nd)
        if name == "mean_dim" and min(sh[d] for sh in t.shapes) == 0:
            return None
        return self.emit(name, [x], [d, int(self.r.random() < 0.5)])

    def g_unary(self):
        name = self.r.choice(["relu", "gelu", "tanh", "sigmoid", "exp", "log"])
        x = self.any_x()
        if name == "exp" and self.T[x].maxabs() > 5:
            return None
        if name == "log" and self.T[x].minval() <= 0.05:
            sq = self.emit("mul", [x, x])  # x in both slots, then a positive shift
            x = sq is not None and self.emit("add_scalar", [sq], [0.25])
            if not x:
                return None
        return self.emit(name, [x])

    def g_softmax(self):
        return self.emit(self.r.choice(["softmax", "log_softmax"]), [self.any_x(lambda nd: nd >= 1)])

    def g_cross_entropy(self):
        def make():
            sh = self.rshapes(self.r.randint(1, 3), zero=False)
            return self.leaf(sh)
        x = self.pick(lambda t: t.nd >= 1 and t.fixed(t.nd - 1) and t.dim(-1) > 0 and
                      min(math.prod(sh[:-1]) for sh in t.shapes) > 0, make)
        t = self.T[x]
        if not (t.fixed(t.nd - 1) and t.dim(-1) > 0 and min(math.prod(sh[:-1]) for sh in t.shapes) > 0):
            return None
        tg = self.leaf([sh[:-1] for sh in t.shapes], kind="data",
                       dtype=self.r.choice([I32, I64]), irange=t.dim(-1))
        return self.emit("cross_entropy", [x, tg])

    def g_mse(self):
        x = self.any_x()
        t = self.T[x]
        if t.min_numel() == 0:
            return None
        y = x if self.r.random() < 0.2 else self.like(t.shapes)
        return self.emit("mse", [x, y] if self.r.random() < 0.5 else [y, x])

    def g_layernorm(self):
        x = self.pick(lambda t: t.nd >= 1 and t.fixed(t.nd - 1) and t.dim(-1) > 0,
                      lambda: self.leaf(self.rshapes(self.r.randint(1, 3), zero=False)))
        t = self.T[x]
        C = t.dim(-1)

        def wb():
            r = self.r.random()
            if r < 0.25:
                return None
            if r < 0.55 and t.nd == 1 and t.allfixed():
                return x  # weight (or bias) = the input itself
            return self.pick(lambda u: u.nd == 1 and u.allfixed() and u.dim(0) == C,
                             lambda: self.leaf((C,)), 0.6)
        eps = f32(self.r.choice([1e-5, 1e-3, 0.1]))
        return self.emit("layernorm", [x, wb(), wb()], [eps])

    def g_batchnorm(self):
        x = self.pick(lambda t: 2 <= t.nd <= 4 and t.fixed(1) and t.dim(1) > 0,
                      lambda: self.leaf(self.rshapes(self.r.randint(2, 4), zero=False)))
        t = self.T[x]
        C = t.dim(1)

        def wb():
            return None if self.r.random() < 0.25 else self.pick(
                lambda u: u.nd == 1 and u.allfixed() and u.dim(0) == C, lambda: self.leaf((C,)), 0.6)
        train = int(self.r.random() < 0.7)  # running statistics only in eval: train updates them
        rm = None if train else self.leaf((C,), kind="data")
        rv = None if train else self.leaf((C,), kind="data", style="var")
        eps = f32(self.r.choice([1e-5, 1e-3, 0.1]))
        return self.emit("batchnorm", [x, wb(), wb(), rm, rv], [train, eps])

    def g_embedding(self):
        w = self.pick(lambda t: t.nd == 2 and t.allfixed() and t.dim(0) > 0,
                      lambda: self.leaf((self.rdim(zero=False), self.rdim())), 0.6)
        V = self.T[w].dim(0)
        if V == 0:
            return None
        idx = self.leaf(self.rshapes(self.r.randint(0, 3)), kind="data",
                        dtype=self.r.choice([I32, I64]), irange=V)
        return self.emit("embedding", [w, idx])

    def g_dropout(self):
        return self.emit("dropout", [self.any_x()], [f32(self.r.choice([0.0, 0.25, 0.5]))])

    def g_causal(self):
        c = self.pool(lambda t: t.nd >= 2 and t.fixed(t.nd - 1) and t.fixed(t.nd - 2) and
                      t.dim(-1) == t.dim(-2))
        if c and self.r.random() < 0.4:
            s = self.r.choice(c)
        else:  # scores q k^T, k = q sometimes
            T_, D = self.r.choice([0, 1, 2, 3, 5, 17]), self.rdim()
            q = self.leaf([(b, T_, D) for b in self.B] if self.r.random() < 0.5 else (self.small(), T_, D))
            k = q if self.r.random() < 0.4 else self.leaf(self.T[q].shapes)
            s = self.emit("matmul_t", [q, k], [0, 1])
            if s is None:
                return None
        m = self.emit("causal_mask", [s], hide=True)
        return m is not None and self.emit("softmax", [m])

    def image(self, hw_min=1):
        def make():
            C, H, W = self.r.randint(1, 3), self.r.randint(hw_min, 6), self.r.randint(hw_min, 6)
            if self.r.random() < 0.5:
                return self.leaf([(b, C, H, W) for b in self.B])
            return self.leaf((self.small(), C, H, W))
        # C >= 1: PyTorch 1.13 returns 0 output channels for 0 input channels
        return self.pick(lambda t: t.nd == 4 and all(t.fixed(d) for d in (1, 2, 3)) and
                         min(t.dim(1), t.dim(2), t.dim(3)) >= hw_min, make, 0.5)

    def g_conv2d(self):
        x = self.image()
        t = self.T[x]
        N, C, H, W = t.shapes[0]
        stride, pad = self.r.randint(1, 3), self.r.randint(0, 2)
        if self.r.random() < 0.15 and t.allfixed() and N > 0:
            w, O = x, N  # conv2d(x, x)
        else:
            O = self.r.randint(1, 3)
            KH, KW = self.r.randint(1, min(3, H + 2 * pad)), self.r.randint(1, min(3, W + 2 * pad))
            w = self.leaf((O, C, KH, KW), kind=self.r.choice(["param", "param", "pers", "gdata"]))
        b = None if self.r.random() < 0.3 else self.leaf((O,))
        return self.emit("conv2d", [x, w, b], [stride, pad])

    def g_maxpool(self):
        x = self.image()
        H, W = self.T[x].dim(2), self.T[x].dim(3)
        k = self.r.randint(1, min(3, H, W))
        return self.emit("maxpool2d", [x], [k, self.r.randint(1, 3)])

    def g_avgpool(self):
        x = self.image()
        if self.r.random() < 0.3:
            return self.emit("global_avgpool2d", [x])
        H, W = self.T[x].dim(2), self.T[x].dim(3)
        k = self.r.randint(1, min(3, H, W))
        return self.emit("avgpool2d", [x], [k, self.r.randint(1, 3)])

    def g_leaky_relu(self):
        slope = f32(self.r.choice([0.01, 0.2, -0.5, 1.5]))
        return self.emit("leaky_relu", [self.any_x()], [slope])

    def g_concat(self):
        x = self.any_x(lambda nd: nd >= 1)
        t = self.T[x]
        d = self.r.randrange(-t.nd, t.nd)
        xs = [x]
        for _ in range(self.r.randint(0, 3)):
            r = self.r.random()
            if r < 0.3:
                xs.append(x)
            else:
                n = self.rdim()
                sh = [s[:d % t.nd] + (n,) + s[d % t.nd + 1:] for s in t.shapes]
                xs.append(self.like(sh))
        self.r.shuffle(xs)
        return self.emit("concat", xs, [d])

    def g_split(self):
        x = self.any_x(lambda nd: nd >= 1)
        t = self.T[x]
        dims = [d for d in range(t.nd) if t.fixed(d)]
        if not dims:
            return None
        d = self.r.choice(dims)
        S, n = t.dim(d), self.r.randint(1, 4)
        cuts = sorted(self.r.randint(0, S) for _ in range(n - 1))
        sizes = [b - a for a, b in zip([0] + cuts, cuts + [S])]
        dd = d - t.nd if self.r.random() < 0.3 else d
        return self.emit("split", [x], [dd, n] + sizes, nout=n)

    def g_attention(self):
        heads, hd = self.r.randint(1, 3), self.r.choice([1, 2, 3, 4])
        C = heads * hd
        T_ = self.r.choice([0, 1, 2, 3, 5, 17])
        bt = [(b, T_) for b in self.B] if self.r.random() < 0.5 else [(self.small(), T_)] * self.steps
        if self.r.random() < 0.5:  # qkv from a c_attn linear
            x = self.leaf([s + (self.rdim(),) for s in bt[:1]] * self.steps if len(set(bt)) == 1 else
                          [s + (3,) for s in bt])
            D = self.T[x].dim(-1)
            qkv = self.emit("linear", [x, self.leaf((3 * C, D)), None if self.r.random() < 0.5 else self.leaf((3 * C,))])
        else:
            qkv = self.pick(lambda t: t.nd == 3 and t.fixed(2) and t.dim(2) == 3 * C,
                            lambda: self.leaf([s + (3 * C,) for s in bt]), 0.5)
        if qkv is None:
            return None
        scale = f32(1 / math.sqrt(hd) if self.r.random() < 0.6 else self.r.uniform(0.1, 1.0))
        return self.emit("attention", [qkv], [heads, int(self.r.random() < 0.5), scale])

    def g_mlp(self, add=False):
        x = self.pick(lambda t: t.nd >= 1 and t.fixed(t.nd - 1),
                      lambda: self.leaf(self.rshapes(self.r.randint(1, 3))))
        t = self.T[x]
        C = t.dim(-1)
        if self.r.random() < 0.25:  # tied: w1 = w2 (F = O = C), maybe b1 = b2
            w1 = w2 = self.leaf((C, C))
            b1 = None if self.r.random() < 0.3 else self.leaf((C,))
            b2 = b1 if self.r.random() < 0.5 else None if self.r.random() < 0.3 else self.leaf((C,))
            O = C
        else:
            F_ = self.rdim()
            O = C if add and self.r.random() < 0.5 else self.rdim()
            w1, w2 = self.leaf((F_, C)), self.leaf((O, F_))
            b1 = None if self.r.random() < 0.3 else self.leaf((F_,))
            b2 = None if self.r.random() < 0.3 else self.leaf((O,))
        if not add:
            return self.emit("mlp_gelu", [x, w1, b1, w2, b2])
        res = self.residual(x, [sh[:-1] + (O,) for sh in t.shapes])
        return res is not None and self.emit("mlp_gelu_add", [x, w1, b1, w2, b2, res])

    def g_to_dtype(self):
        x = self.any_x()
        y = self.emit("to_dtype", [x], [self.r.choice([F16, BF16, F64])], hide=True)
        return y is not None and self.emit("to_dtype", [y], [F32])

    GENS = [("g_reshape", 2), ("g_slice", 1), ("g_transpose", 1), ("g_permute", 1),
            ("g_contiguous", 1), ("g_matmul", 3), ("g_linear", 2), ("g_linear_add", 2),
            ("g_binary", 4), ("g_scale", 1), ("g_reduce", 2), ("g_unary", 3), ("g_softmax", 1),
            ("g_cross_entropy", 1), ("g_mse", 1), ("g_layernorm", 2), ("g_embedding", 1),
            ("g_dropout", 1), ("g_causal", 1), ("g_conv2d", 2), ("g_maxpool", 1),
            ("g_concat", 2), ("g_split", 1), ("g_attention", 2), ("g_mlp", 2), ("g_mlp_add", 2),
            ("g_to_dtype", 1), ("g_avgpool", 1), ("g_leaky_relu", 1),
            ("g_batchnorm", 2)]

    def g_linear_add(self):
        return self.g_linear(add=True)

    def g_mlp_add(self):
        return self.g_mlp(add=True)

    # ---- whole program
    def settings(self):
        p, r = self.p, self.r
        p.train = r.random() < 0.85
        p.dump_all = not self.big
        if self.steps > 1:
            p.zero_grad = r.random() < 0.75
        if not self.mode["optim"]:
            return
        kind = r.choice(["sgd", "adamw", "lamb", "lars"])
        c = r.choice
        if kind == "sgd":
            mom = c([0.0, 0.5, 0.9])
            nest = int(mom > 0 and r.random() < 0.3)
            args = [c([0.01, 0.1, 0.5]), mom, 0.0 if nest else c([0.0, 0.1]), nest, c([0.0, 0.01, 0.1])]
        elif kind in ("adamw", "lamb"):
            args = [c([1e-3, 1e-2, 0.1]), c([0.9, 0.5, 0.0]), c([0.999, 0.9]), c([1e-8, 1e-6, 1e-3]),
                    c([0.0, 1e-2, 0.1])]
        else:
            args = [c([0.1, 1.0]), c([0.9, 0.0]), c([0.0, 5e-4, 0.01]), c([1e-3, 0.02]), c([0.0, 1e-6]),
                    int(r.random() < 0.5)]
        suffix = ".bias" if kind == "lars" and r.random() < 0.3 else ""
        p.optim = (kind, [f32(a) if i != 3 or kind != "sgd" else a for i, a in enumerate(args)], suffix)
        if kind == "lars":
            p.optim[1][5] = args[5]
        if r.random() < 0.3:
            p.clip = f32(c([0.1, 1.0, 10.0]))
        if r.random() < 0.3:
            p.sched = (r.randint(0, 4), p.optim[1][0], r.randint(0, 3), r.randint(2, 6), r.randint(1, 3),
                       f32(c([0.5, 0.9])), f32(c([0.0, p.optim[1][0] / 10])))

    def loss(self):
        sinks = [i for i, t in self.T.items() if not t.leaf and not t.hidden and t.dtype == F32
                 and t.rg and t.uses == 0]
        rgs = [i for i, t in self.T.items() if not t.hidden and t.dtype == F32 and t.rg]
        if not rgs:
            return False
        terms = sinks[:6] or [self.r.choice(rgs)]
        if self.r.random() < 0.3:
            terms.append(self.r.choice(rgs))
        for t in dict.fromkeys(terms):
            self.p.terms.append((t, self.leaf(list(self.T[t].shapes), kind="data")))
        self.p.with_grad = len(self.p.terms) == 1 and self.r.random() < 0.3
        return True

    def build(self):
        self.settings()
        want = self.r.randint(3, 12)
        names = [n for n, w in self.GENS for _ in range(w)]
        tries = 0
        while len(self.p.ops) < want and tries < 300:
            tries += 1
            snap = self.snapshot()
            try:
                ok = getattr(self, self.r.choice(names))()
            except TooBig:
                ok = False
            if not ok:
                self.rollback(snap)
        if not self.loss():
            return None
        return self.p


def generate(seed, mode):
    for attempt in range(20):
        p = Gen(seed * 1000 + attempt if attempt else seed, mode).build()
        if p is not None:
            p.name = f"s{seed}"
            p.seed = seed
            return p
    raise RuntimeError(f"seed {seed}: no valid program in 20 attempts")


# --------------------------------------------------------------- minimiser

def prune(p):
    """Drops ops and leaves the loss does not depend on."""
    need = {i for tc in p.terms for i in tc}
    keep = []
    for op in reversed(p.ops):
        if any(o in need for o in op.outs):
            keep.append(op)
            need.update(i for i in op.ins if i is not None)
    p.ops = keep[::-1]
    p.leaves = {i: lf for i, lf in p.leaves.items() if i in need}
    return p


def same_failure(a, b):
    if a.startswith("fail:mismatch"):
        return b.startswith("fail:mismatch")
    return a == b


class Minimiser:
    """Greedy shrinking: the first candidate that still fails the same way
    replaces the program, until no candidate does (or the budget runs out)."""

    def __init__(self, runner, prog, status, seconds=60.0):
        self.runner, self.status = runner, status
        self.deadline = time.time() + seconds
        self.cur, self.evals, self.tried = prog, 0, set()

    def outcome(self, cand):
        """The candidate's status, or None when it was tried before."""
        cand.name = "min"
        key = serialize(cand)
        if key in self.tried:
            return None
        self.tried.add(key)
        self.evals += 1
        out = self.runner.run([cand])[cand.name]
        return check(cand, out)[0]

    def ref_env(self, p):
        return replay(p, torch.float64, self.runner.run([p])[p.name].get("M", {}))["env"]

    def candidates(self, p):
        for j in range(p.steps if p.steps > 1 else 0):
            yield self.drop_step(p, j)
        if p.optim:
            yield self.edit(p, optim=None, clip=0.0, sched=None)
        if p.clip or p.sched:
            yield self.edit(p, clip=0.0, sched=None)
        if p.train:
            yield self.edit(p, train=False)
        if len(p.terms) > 1:
            for k in range(len(p.terms)):
                q = copy.deepcopy(p)
                del q.terms[k]
                yield prune(q)
        try:
            env = self.ref_env(p)
        except Exception:
            env = None
        for k in reversed(range(len(p.ops))):
            if env is not None:
                yield self.cut(p, k, env)
            yield from self.bypass(p, k)
        sizes = sorted({d for lf in p.leaves.values() for v in lf.vals for d in v.shape if d > 1},
                       reverse=True)
        for v in sizes:
            for v2 in sorted({0, 1, v // 2}):
                yield self.shrink(p, v, v2)
        for i, lf in p.leaves.items():
            if lf.dtype == F32:
                for f in (np.zeros_like, np.ones_like, np.round):
                    q = copy.deepcopy(p)
                    q.leaves[i].vals = [f(v) for v in lf.vals]
                    if not all(np.array_equal(a, b) for a, b in zip(q.leaves[i].vals, lf.vals)):
                        yield q

    def edit(self, p, **kw):
        q = copy.deepcopy(p)
        for k, v in kw.items():
            setattr(q, k, v)
        return q

    def drop_step(self, p, j):
        q = self.edit(p, steps=p.steps - 1)
        for lf in q.leaves.values():
            if len(lf.vals) > 1:
                del lf.vals[j]
        return q

    def cut(self, p, k, env):
        """Op k's results become leaves holding their reference values."""
        if p.ops[k].name == "to_dtype":  # its f16/bf16 result is no f32 leaf
            return p
        q = copy.deepcopy(p)
        op = q.ops[k]
        for o in op.outs:
            vals = [np.float32(e[o]).astype(np.float64) for e in env]
            q.leaves[o] = Leaf(o, "gdata", F32, vals if p.steps > 1 else vals[:1])
        del q.ops[k]
        return prune(q)

    def bypass(self, p, k):
        op = p.ops[k]
        if len(op.outs) != 1 or op.name == "to_dtype":
            return
        for i in op.ins:
            if i is None or i == op.outs[0]:
                continue
            q = copy.deepcopy(p)
            o = op.outs[0]
            del q.ops[k]
            for later in q.ops:
                later.ins = [i if j == o else j for j in later.ins]
            q.terms = [(i if t == o else t, c) for t, c in q.terms]
            yield prune(q)

    def shrink(self, p, v, v2):
        q = copy.deepcopy(p)
        for lf in q.leaves.values():
            lf.vals = [x[tuple(slice(0, v2) if d == v else slice(None) for d in x.shape)] for x in lf.vals]
        for op in q.ops:
            if op.name == "reshape":
                op.attrs = [op.attrs[0]] + [float(v2) if a == v else a for a in op.attrs[1:]]
            elif op.name == "slice":
                op.attrs = [min(a, float(v2)) for a in op.attrs]
        return q

    def run(self):
        progress = True
        while progress and time.time() < self.deadline:
            progress = False
            for cand in self.candidates(self.cur):
                if time.time() >= self.deadline:
                    break
                if cand is self.cur:
                    continue
                try:
                    st = self.outcome(cand)
                except Exception:
                    continue
                if st and same_failure(self.status, st):
                    self.cur, progress = cand, True
                    break
        return self.cur


def describe(p):
    """A readable listing of a program."""
    lines = [f"# steps {p.steps}, zero_grad {int(p.zero_grad)}, train {int(p.train)}"
             + (f", optim {p.optim[0]} {p.optim[1]} {p.optim[2]}" if p.optim else "")
             + (f", clip {p.clip}" if p.clip else "") + (f", sched {p.sched}" if p.sched else "")]
    dtn = {F32: "f32", I32: "i32", I64: "i64"}
    for lf in p.leaves.values():
        for s, v in enumerate(lf.vals):
            vs = np.array2string(v, threshold=40, max_line_width=200, precision=9, separator=", ")
            step = "" if len(lf.vals) == 1 else f" step {s}"
            lines.append(f"t{lf.id} = {lf.kind} {dtn[lf.dtype]} {tuple(v.shape)}{step} = {' '.join(vs.split())}")
    ops, loss, gid, _ = full_ops(p)
    for op in ops:
        ins = ", ".join("NULL" if i is None else f"t{i}" for i in op.ins)
        att = ", ".join(num(a) for a in op.attrs)
        lines.append(f"{', '.join(f't{o}' for o in op.outs)} = {op.name}({ins}{'; ' + att if att else ''})")
    lines.append(f"backward(t{loss}" + (f", grad t{gid})" if gid is not None else ")"))
    return "\n".join(lines)


# ------------------------------------------------------------------- CLI

def mode_of(args):
    return {"steps": args.steps or (3 if args.optim else 1), "optim": args.optim,
            "threads": args.threads or 1}


def repro(args, seed):
    flags = f" --threads {args.threads}" if args.threads else ""
    flags += f" --steps {args.steps}" if args.steps else ""
    flags += " --optim" if args.optim else ""
    return f"/usr/bin/python3 {os.path.relpath(__file__)} --prog {args.prog} --seed {seed}{flags}"


def run_seeds(seeds, args):
    """Generates, runs and checks the given seeds; returns [(seed, status, detail)]."""
    mode = mode_of(args)
    runner = Runner(args.prog, args.threads)
    progs = [generate(s, mode) for s in seeds]
    outs = runner.run(progs)
    res = []
    for p in progs:
        st, detail = check(p, outs[p.name])
        res.append((p.seed, st, detail, [op.name for op in p.ops]))
    return res


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prog", default=os.environ.get("DG_PROG"), help="the dg_prog binary")
    ap.add_argument("--seeds", help="seeds: A-B (inclusive) or a comma list of those")
    ap.add_argument("--seed", type=int, help="first seed (with --count)")
    ap.add_argument("--count", type=int, default=1, help="programs from --seed on")
    ap.add_argument("--random", type=int, default=0, help="N more programs from a fresh random base seed")
    ap.add_argument("--threads", type=int, default=0, help="DG_NUM_THREADS for dgrad (and bigger tensors)")
    ap.add_argument("--steps", type=int, default=0, help="steps per program (dg_ctx_reset between)")
    ap.add_argument("--optim", action="store_true", help="programs train with an optimizer")
    ap.add_argument("--minimise", dest="minimise", action="store_true", default=True)
    ap.add_argument("--no-minimise", dest="minimise", action="store_false")
    ap.add_argument("--minimise-limit", type=int, default=3, help="failures to minimise")
    ap.add_argument("--minimise-seconds", type=float, default=60.0, help="budget per failure")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--show", action="store_true", help="print the programs, run nothing")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if not args.prog:
        for b in ("build-diff", "build"):
            cand = os.path.join(HERE, "..", "..", b, "tests", "diff", "dg_prog")
            if os.path.exists(cand):
                args.prog = os.path.normpath(cand)
                break
    if not args.prog and not args.show:
        ap.error("--prog (or DG_PROG) is required")
    return args


def seed_list(args):
    seeds = []
    for part in (args.seeds or "").split(","):
        if part:
            a, _, b = part.partition("-")
            seeds += list(range(int(a), int(b or a) + 1))
    if args.seed is not None:
        seeds += list(range(args.seed, args.seed + args.count))
    if args.random:
        base = int(os.environ.get("DIFFTEST_RANDOM_BASE") or random.SystemRandom().randrange(10**6, 2**31))
        print(f"random seeds: {base}..{base + args.random - 1}", flush=True)
        seeds += list(range(base, base + args.random))
    return seeds or [1]


def chunked(seeds, jobs):
    n = max(1, min(200, len(seeds) // max(1, jobs * 4) or 1))
    return [seeds[i:i + n] for i in range(0, len(seeds), n)]


def main(argv):
    args = parse_args(argv)
    seeds = seed_list(args)
    if args.show:
        for s in seeds:
            p = generate(s, mode_of(args))
            print(describe(p) + "\n")
        return 0
    t0 = time.time()
    if args.jobs > 1:
        import multiprocessing as mp
        with mp.get_context("fork").Pool(args.jobs) as pool:
            parts = pool.starmap(run_seeds, [(c, args) for c in chunked(seeds, args.jobs)])
    else:
        parts = [run_seeds(c, args) for c in chunked(seeds, 1)]
    results = [r for part in parts for r in part]
    passed = sum(1 for r in results if r[1] == "pass")
    skipped = [r for r in results if r[1] in ("fragile", "invalid")]
    failed = [r for r in results if r[1].startswith("fail")]
    cover = {}
    for _, st, _, names in results:
        for n in names:
            cover[n] = cover.get(n, 0) + 1
    mode = mode_of(args)
    print(f"mode: steps {mode['steps']}, optim {mode['optim']}, DG_NUM_THREADS {mode['threads']}; "
          f"{len(results)} programs in {time.time() - t0:.1f}s")
    if not args.quiet:
        print("ops run: " + ", ".join(f"{k} {v}" for k, v in sorted(cover.items())))
    for seed, st, detail, names in failed:
        print(f"FAIL seed {seed} [{st}]: {detail}\n  ops: {' '.join(names)}\n  reproduce: {repro(args, seed)}")
    runner = Runner(args.prog, args.threads)
    for seed, st, detail, _ in failed[:args.minimise_limit if args.minimise else 0]:
        p = generate(seed, mode_of(args))
        m = Minimiser(runner, p, st, args.minimise_seconds).run()
        st2, detail2 = check(m, runner.run([m])[m.name])
        path = os.path.join(tempfile.gettempdir(), f"difftest-{seed}.dgp")
        with open(path, "w") as f:
            f.write(serialize(m))
        print(f"minimised seed {seed} ({len(p.ops)} -> {len(m.ops)} ops, {len(m.leaves)} leaves; "
              f"{st2}: {detail2})\n{describe(m)}\n  dg_prog input: {path}")
    if skipped:
        print(f"{len(skipped)} skipped (fragile: a kink within rounding): seeds "
              + " ".join(str(r[0]) for r in skipped[:20]))
    print(f"{passed} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
