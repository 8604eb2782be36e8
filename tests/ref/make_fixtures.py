#!/usr/bin/python3
"""Writes the reference fixtures that tests/ref/test_ref.c checks dgrad against.

Run with Debian's interpreter and python3-torch (PyTorch 1.13):

    /usr/bin/python3 tests/ref/make_fixtures.py        # writes tests/ref/fixtures/*.dgref
    /usr/bin/python3 tests/ref/make_fixtures.py --check  # recomputes, compares with the files

The fixtures are committed, so the C test needs no torch. Everything is seeded
(torch.manual_seed per model) and the output is byte-for-byte reproducible on
one CPU; --check also accepts float64 noise from another (see agree).

Numerics. Inputs and parameters are drawn in float32 and stored as float32.
The forward and backward pass is then run twice from those exact values: in
float32 (what a float32 engine is expected to get) and in float64 (the truth).
The script asserts that the two agree to 1e-5 relative to each tensor's largest
magnitude, then stores the float64 results rounded to float32, so the C test
compares against the exact answer rather than against torch's own rounding.

File format (little-endian throughout, version 1):

    magic    8 bytes  "DGREF\\0\\0\\0"
    version  u32      1
    count    u32      number of tensors
    count times:
      name_len u32, name (name_len bytes, UTF-8, no terminator)
      dtype    u32      dgrad's dg_dtype code: 0 f32, 4 i64
      ndim     u32      0..4
      dims     i64 * ndim
      data     numel * dtype size bytes, row-major

Tensor names: "in.<name>" inputs, "p.<param>" parameter values,
"out.logits" / "out.pred", "out.loss", "g.<param>" parameter gradients,
"g.in.<name>" the gradient of a float input. Parameters appear in the order
the model registers them.
"""
import argparse
import copy
import hashlib
import math
import os
import struct
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    if "--check" in sys.argv:  # the meson test: no torch here is a skip
        print("SKIP: no torch for %s (use /usr/bin/python3 with python3-torch)"
              % sys.executable)
        sys.exit(77)
    sys.exit("make_fixtures.py needs torch: run it with /usr/bin/python3 "
             "(Debian's python3-torch)")

MAGIC = b"DGREF\0\0\0"
VERSION = 1
DT_F32 = 0
DT_I64 = 4
AGREE_TOL = 1e-5  # float32 torch vs float64 torch, relative to max |value|

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "fixtures")


# ---------------------------------------------------------------- models

class MLP(nn.Module):
    """784-128-64-10, ReLU."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 128)
        self.fc2 = nn.Linear(128, 64)
        self.fc3 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class ConvNet(nn.Module):
    """(N,1,12,12) -> conv 1->4 3x3 s1 p1 -> relu -> maxpool 2 -> (N,4,6,6)
    -> conv 4->8 3x3 s2 p0 -> relu -> (N,8,2,2) -> flatten 32 -> linear 10."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, stride=1, padding=1)
        self.conv2 = nn.Conv2d(4, 8, 3, stride=2, padding=0)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(x, 2, 2)
        x = F.relu(self.conv2(x))
        x = x.reshape(x.shape[0], -1)
        return self.fc(x)


class Block(nn.Module):
    """GPT-2 pre-LN block: x + attn(ln1(x)), then + mlp(ln2(.))."""

    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln1 = nn.LayerNorm(d)
        self.attn_qkv = nn.Linear(d, 3 * d)   # weight (3d, d): rows q | k | v
        self.attn_proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def attn(self, x):
        B, T, D = x.shape
        H = self.n_head
        hd = D // H
        qkv = self.attn_qkv(x)                        # (B, T, 3D)
        q, k, v = qkv.split(D, dim=2)                 # each (B, T, D)
        q = q.reshape(B, T, H, hd).permute(0, 2, 1, 3).reshape(B * H, T, hd)
        k = k.reshape(B, T, H, hd).permute(0, 2, 1, 3).reshape(B * H, T, hd)
        v = v.reshape(B, T, H, hd).permute(0, 2, 1, 3).reshape(B * H, T, hd)
        att = torch.bmm(q, k.transpose(1, 2)) * (1.0 / math.sqrt(hd))  # (BH, T, T)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)  # above the diagonal
        att = att.masked_fill(mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = torch.bmm(att, v)                         # (BH, T, hd)
        y = y.reshape(B, H, T, hd).permute(0, 2, 1, 3).reshape(B, T, D)
        return self.attn_proj(y)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        h = F.gelu(self.mlp_fc(self.ln2(x)), approximate="tanh")
        return x + self.mlp_proj(h)


class TinyGPT(nn.Module):
    """wte + wpe -> one block -> ln_f -> head (no bias) -> logits (B, T, V)."""

    def __init__(self, vocab=16, ctx=8, d=32, n_head=4):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.block = Block(d, n_head)
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        B, T = idx.shape
        pos = torch.arange(T, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)            # (B, T, D) + (T, D)
        x = self.block(x)
        return self.head(self.ln_f(x))


class Regressor(nn.Module):
    """5 -> 8 (tanh) -> 3, mean squared error."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(5, 8)
        self.fc2 = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class PoolNet(nn.Module):
    """(N,2,11,10) -> conv 2->4 3x3 p1 -> leaky_relu 0.1 -> avgpool 3 s2 -> (N,4,5,4)
    -> conv 4->6 3x3 p1 -> leaky_relu 0.01 -> avgpool 2 s1 -> (N,6,4,3)
    -> global average pool -> (N,6) -> linear 5."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 4, 3, stride=1, padding=1)
        self.conv2 = nn.Conv2d(4, 6, 3, stride=1, padding=1)
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        x = F.avg_pool2d(F.leaky_relu(self.conv1(x), 0.1), 3, 2)
        x = F.avg_pool2d(F.leaky_relu(self.conv2(x), 0.01), 2, 1)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def perturb_layernorms(model):
    # Default LayerNorm is w = 1, b = 0, which would hide a kernel that ignores
    # or swaps them; move them off those values.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.add_(0.1 * torch.randn_like(m.weight))
                m.bias.add_(0.1 * torch.randn_like(m.bias))


# ---------------------------------------------------------------- cases

def case_mlp():
    torch.manual_seed(1001)
    model = MLP()
    x = torch.randn(8, 784)
    y = torch.randint(0, 10, (8,))
    return dict(model=model, inputs=[("x", x, True), ("targets", y, False)],
                forward=lambda m, ins: m(ins["x"]), out_name="logits",
                loss=lambda out, ins: F.cross_entropy(out, ins["targets"]))


def case_conv():
    torch.manual_seed(1002)
    model = ConvNet()
    x = torch.randn(4, 1, 12, 12)
    y = torch.randint(0, 10, (4,))
    return dict(model=model, inputs=[("x", x, True), ("targets", y, False)],
                forward=lambda m, ins: m(ins["x"]), out_name="logits",
                loss=lambda out, ins: F.cross_entropy(out, ins["targets"]))


def case_gpt():
    torch.manual_seed(1003)
    model = TinyGPT()
    perturb_layernorms(model)
    seq = torch.randint(0, 16, (2, 9))
    idx, tgt = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()  # shifted targets
    return dict(model=model, inputs=[("idx", idx, False), ("targets", tgt, False)],
                forward=lambda m, ins: m(ins["idx"]), out_name="logits",
                loss=lambda out, ins: F.cross_entropy(out.reshape(-1, out.shape[-1]),
                                                      ins["targets"].reshape(-1)))


def case_mse():
    torch.manual_seed(1004)
    model = Regressor()
    x = torch.randn(6, 5)
    t = torch.randn(6, 3)
    return dict(model=model, inputs=[("x", x, True), ("target", t, False)],
                forward=lambda m, ins: m(ins["x"]), out_name="pred",
                loss=lambda out, ins: F.mse_loss(out, ins["target"]))


def case_pool():
    torch.manual_seed(1005)
    model = PoolNet()
    x = torch.randn(4, 2, 11, 10)
    y = torch.randint(0, 5, (4,))
    return dict(model=model, inputs=[("x", x, True), ("targets", y, False)],
                forward=lambda m, ins: m(ins["x"]), out_name="logits",
                loss=lambda out, ins: F.cross_entropy(out, ins["targets"]))


CASES = [("mlp", case_mlp), ("conv", case_conv), ("gpt", case_gpt), ("mse", case_mse),
         ("pool", case_pool)]


# ---------------------------------------------------------------- running

def run(case, dtype):
    model = copy.deepcopy(case["model"]).to(dtype)
    ins = {}
    for name, t, needs_grad in case["inputs"]:
        t = t.clone()
        if t.is_floating_point():
            t = t.to(dtype)
            t.requires_grad_(needs_grad)
        ins[name] = t
    out = case["forward"](model, ins)
    loss = case["loss"](out, ins)
    loss.backward()
    res = {"out": out.detach(), "loss": loss.detach()}
    for name, p in model.named_parameters():
        res["g." + name] = p.grad.detach()
    for name, t, needs_grad in case["inputs"]:
        if needs_grad:
            res["g.in." + name] = ins[name].grad.detach()
    return res


def rel_err(a, b):
    a, b = a.double(), b.double()
    scale = max(b.abs().max().item(), 1e-30)
    return (a - b).abs().max().item() / scale


def build(name, case):
    r32 = run(case, torch.float32)
    r64 = run(case, torch.float64)
    worst = 0.0
    for k in r64:
        e = rel_err(r32[k], r64[k])
        worst = max(worst, e)
        if not e <= AGREE_TOL:
            sys.exit(f"{name}: float32 and float64 torch disagree on {k}: {e:.3g}")
    tensors = []
    for iname, t, _ in case["inputs"]:
        tensors.append(("in." + iname, t))
    for pname, p in case["model"].named_parameters():
        tensors.append(("p." + pname, p.detach()))
    tensors.append(("out." + case["out_name"], r64["out"]))
    tensors.append(("out.loss", r64["loss"]))
    for pname, _ in case["model"].named_parameters():
        tensors.append(("g." + pname, r64["g." + pname]))
    for iname, t, needs_grad in case["inputs"]:
        if needs_grad:
            tensors.append(("g.in." + iname, r64["g.in." + iname]))
    return tensors, worst


def encode(tensors):
    buf = bytearray(MAGIC)
    buf += struct.pack("<II", VERSION, len(tensors))
    for name, t in tensors:
        t = t.detach().contiguous()
        if t.is_floating_point():
            t, code, fmt = t.to(torch.float32), DT_F32, "<f"
        else:
            t, code, fmt = t.to(torch.int64), DT_I64, "<q"
        assert t.dim() <= 4, name
        nb = name.encode()
        buf += struct.pack("<I", len(nb)) + nb
        buf += struct.pack("<II", code, t.dim())
        buf += struct.pack("<%dq" % t.dim(), *t.shape)
        vals = t.reshape(-1).tolist()
        buf += struct.pack("<%d%s" % (len(vals), fmt[1]), *vals)
    return bytes(buf)


def decode(data):
    """Reads a fixture back (the same checks the C reader makes)."""
    if data[:8] != MAGIC:
        raise ValueError("bad magic")
    version, count = struct.unpack_from("<II", data, 8)
    if version != VERSION:
        raise ValueError("version %d, expected %d" % (version, VERSION))
    off, out = 16, {}
    for _ in range(count):
        (n,) = struct.unpack_from("<I", data, off)
        off += 4
        name = data[off:off + n].decode()
        off += n
        code, ndim = struct.unpack_from("<II", data, off)
        off += 8
        dims = struct.unpack_from("<%dq" % ndim, data, off)
        off += 8 * ndim
        numel = math.prod(dims)
        fmt, size = ("f", 4) if code == DT_F32 else ("q", 8)
        vals = struct.unpack_from("<%d%s" % (numel, fmt), data, off)
        off += numel * size
        out[name] = (code, dims, vals)
    if off != len(data):
        raise ValueError("trailing bytes")
    return out


# A float64 result differs from CPU to CPU in its last bits (torch's kernels
# sum in other orders on AVX2 and AVX-512); rounded to float32 that is
# nothing, except where the exact answer is zero and the stored value is
# float64 noise (the gradient of the key bias, about 1e-19 against gradients
# of 0.03, on a Zen 3). So a fixture is current when it is byte for byte the
# file, or differs only by this much of each tensor's largest magnitude.
NOISE_TOL = 1e-12


def agree(old, new):
    """'same', 'same within noise', or what differs between two fixtures."""
    if old == new:
        return "same"
    try:
        a = decode(old)
    except (ValueError, struct.error) as e:
        return "DIFFERS (the file does not decode: %s)" % e
    b = decode(new)
    if list(a) != list(b):
        return "DIFFERS (tensor names or order)"
    for name in a:
        (ca, da, va), (cb, db, vb) = a[name], b[name]
        if ca != cb or da != db:
            return "DIFFERS (%s: dtype or shape)" % name
        if ca != DT_F32:
            if va != vb:
                return "DIFFERS (%s)" % name
            continue
        top = max((abs(v) for v in va), default=0.0)
        worst = max((abs(x - y) for x, y in zip(va, vb)), default=0.0)
        if worst > NOISE_TOL * top:
            return "DIFFERS (%s by %.3g, largest magnitude %.3g)" % (name, worst, top)
    return "same within noise"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true",
                    help="recompute and compare with the committed files; write nothing")
    args = ap.parse_args()
    if args.check and not torch.__version__.startswith("1.13"):
        # Other releases may draw different random numbers from the same seed.
        print("SKIP: torch %s; the fixtures were written with 1.13" % torch.__version__)
        return 77
    torch.set_num_threads(1)
    if not args.check:
        os.makedirs(OUT_DIR, exist_ok=True)
    bad = 0
    for name, make in CASES:
        tensors, worst = build(name, make())
        data = encode(tensors)
        back = decode(data)
        for tname, t in tensors:  # round trip
            code, dims, vals = back[tname]
            assert tuple(dims) == tuple(t.shape), tname
            ref = t.detach().reshape(-1)
            got = torch.tensor(vals, dtype=torch.float64 if code == DT_F32 else torch.int64)
            assert torch.equal(got.to(ref.dtype) if code == DT_I64 else got.float(),
                               ref.to(torch.float32) if code == DT_F32 else ref), tname
        path = os.path.join(OUT_DIR, name + ".dgref")
        digest = hashlib.sha256(data).hexdigest()[:16]
        if args.check:
            try:
                with open(path, "rb") as f:
                    same = agree(f.read(), data)
            except FileNotFoundError:
                same = "missing"
            bad += same not in ("same", "same within noise")
            print("%-5s %s %s" % (name, same, digest))
        else:
            with open(path, "wb") as f:
                f.write(data)
            print("%-5s %7d bytes, %2d tensors, f32 vs f64 worst %.2e, sha256 %s -> %s"
                  % (name, len(data), len(tensors), worst, digest,
                     os.path.relpath(path)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
