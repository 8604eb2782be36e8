#!/usr/bin/python3
"""Writes tests/ref/fixtures/batchnorm.dgref, the BatchNorm reference that
tests/ref/test_ref_batchnorm.c checks dgrad's BatchNorm modules against.

    /usr/bin/python3 tests/ref/make_bn_fixtures.py          # writes the fixture
    /usr/bin/python3 tests/ref/make_bn_fixtures.py --check  # compares, writes nothing

Same file format and numerics as make_fixtures.py (whose encoder it uses):
inputs drawn in float32, every result computed in float64 from those values
(and checked against float32 torch to 1e-5), stored as float32.

Per case P (bn2d: BatchNorm2d on (4, 3, 5, 5); bn1d: BatchNorm1d on (8, 4);
bn1d3: BatchNorm1d on (5, 4, 7)), a module in training mode with weight and
bias moved off 1 and 0 takes STEPS batches, one after another, each with its
loss sum(y * g):
  P.p.weight, P.p.bias           initial parameters
  P.hyper                        (momentum, eps)
  P.s<k>.in.x, P.s<k>.in.g       batch k and its output gradient
  P.s<k>.out.y                   output
  P.s<k>.g.in.x / .g.weight / .g.bias    gradients of batch k alone
  P.s<k>.running_mean / _var     running statistics after batch k
  P.acc.g.weight / .g.bias       gradients summed over the batches (gradient
                                 accumulation: micro-batches, one step)
  P.eval.in.x, P.eval.in.g, P.eval.out.y, P.eval.g.in.x / .g.weight / .g.bias
                                 eval mode after the last batch
"""
import argparse
import hashlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as mf  # noqa: E402  (exits 77 / with a message without torch)

torch, nn = mf.torch, mf.nn
STEPS = 3
OUT = os.path.join(mf.OUT_DIR, "batchnorm.dgref")

CASES = [  # name, module class, input shape, momentum, eps, input scale, offset
    ("bn2d", nn.BatchNorm2d, (4, 3, 5, 5), 0.1, 1e-5, 2.0, 0.5),
    ("bn1d", nn.BatchNorm1d, (8, 4), 0.3, 1e-5, 1.5, -1.0),
    ("bn1d3", nn.BatchNorm1d, (5, 4, 7), 0.2, 1e-3, 0.5, 3.0),
]


def draw(name, cls, shape, momentum, eps, scale, offset):
    torch.manual_seed(2001 + sum(map(ord, name)))
    C = shape[1]
    w = 1 + 0.3 * torch.randn(C)
    b = 0.2 * torch.randn(C)
    batches = [(offset + scale * torch.randn(shape), torch.randn(shape)) for _ in range(STEPS)]
    ev = (offset + scale * torch.randn(shape), torch.randn(shape))
    return w, b, batches, ev


def run(case, dtype):
    name, cls, shape, momentum, eps, scale, offset = case
    w, b, batches, ev = draw(*case)
    m = cls(shape[1], eps=eps, momentum=momentum).to(dtype)
    with torch.no_grad():
        m.weight.copy_(w)
        m.bias.copy_(b)
    res, acc_w, acc_b = {}, 0, 0

    def step(key, x, g):
        x = x.to(dtype).requires_grad_(True)
        m.zero_grad()
        y = m(x)
        (y * g.to(dtype)).sum().backward()
        res[key + ".out.y"] = y.detach()
        res[key + ".g.in.x"] = x.grad.detach()
        res[key + ".g.weight"] = m.weight.grad.detach().clone()
        res[key + ".g.bias"] = m.bias.grad.detach().clone()

    m.train()
    for k, (x, g) in enumerate(batches):
        step("s%d" % k, x, g)
        acc_w = acc_w + res["s%d.g.weight" % k]
        acc_b = acc_b + res["s%d.g.bias" % k]
        res["s%d.running_mean" % k] = m.running_mean.detach().clone()
        res["s%d.running_var" % k] = m.running_var.detach().clone()
    res["acc.g.weight"], res["acc.g.bias"] = acc_w, acc_b
    m.eval()
    step("eval", *ev)
    return res, (w, b, batches, ev)


def build(case):
    name, _, _, momentum, eps, _, _ = case
    r32, _ = run(case, torch.float32)
    r64, (w, b, batches, ev) = run(case, torch.float64)
    for k in r64:
        e = mf.rel_err(r32[k], r64[k])
        if not e <= mf.AGREE_TOL:
            sys.exit(f"{name}: float32 and float64 torch disagree on {k}: {e:.3g}")
    t = [(name + ".p.weight", w), (name + ".p.bias", b),
         (name + ".hyper", torch.tensor([momentum, eps]))]
    for k, (x, g) in enumerate(batches):
        t += [("%s.s%d.in.x" % (name, k), x), ("%s.s%d.in.g" % (name, k), g)]
    t += [(name + ".eval.in.x", ev[0]), (name + ".eval.in.g", ev[1])]
    t += [(name + "." + k, v) for k, v in r64.items()]
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the file; write nothing")
    args = ap.parse_args()
    if args.check and not torch.__version__.startswith("1.13"):
        print("SKIP: torch %s; the fixture was written with 1.13" % torch.__version__)
        return 77
    torch.set_num_threads(1)
    tensors = [t for case in CASES for t in build(case)]
    data = mf.encode(tensors)
    back = mf.decode(data)
    assert len(back) == len(tensors)
    digest = hashlib.sha256(data).hexdigest()[:16]
    if args.check:
        try:
            with open(OUT, "rb") as f:
                same = f.read() == data
        except FileNotFoundError:
            same = False
        print("batchnorm %s %s" % ("same" if same else "DIFFERS", digest))
        return 0 if same else 1
    os.makedirs(mf.OUT_DIR, exist_ok=True)
    with open(OUT, "wb") as f:
        f.write(data)
    print("batchnorm %d bytes, %d tensors, sha256 %s -> %s"
          % (len(data), len(tensors), digest, os.path.relpath(OUT)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
