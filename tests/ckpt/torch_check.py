#!/usr/bin/python3
"""Reads a dgrad checkpoint with PyTorch (run by test_ckpt_torch.c).

    /usr/bin/python3 torch_check.py DIR

DIR holds model.safetensors, input.f32 (3, 1, 8, 8) and expected.f32 (3, 10),
little-endian float32. The safetensors header is parsed here with json and
struct (no safetensors package); each tensor is read at its data_offsets into
torch; the same network as test_ckpt_torch.c runs in torch and its output
must match dgrad's. Exit 0 on match, 1 on mismatch, 77 without torch.
"""
import json
import struct
import sys


def read_safetensors(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        meta = header.pop("__metadata__", {})
        tensors = {}
        for name, e in header.items():
            assert e["dtype"] == "F32", (name, e["dtype"])
            b, end = e["data_offsets"]
            f.seek(8 + n + b)
            raw = bytearray(f.read(end - b))
            t = torch.frombuffer(raw, dtype=torch.float32) if raw else torch.empty(0)
            tensors[name] = t.reshape(e["shape"]).clone()
    return tensors, meta


def main():
    d = sys.argv[1]
    tensors, meta = read_safetensors(d + "/model.safetensors")
    assert meta["format"] == "dgrad" and meta["optim"] == "adamw", meta
    assert meta["step"] == "2" and meta["optim_step"] == "2", meta
    params = {k[len("net."):]: v for k, v in tensors.items() if k.startswith("net.")}
    for k, v in tensors.items():
        if k.startswith("optim."):
            state, _, pname = k[len("optim."):].partition(".")
            assert state in ("exp_avg", "exp_avg_sq"), k
            assert v.shape == tensors[pname].shape, k
    assert len(tensors) == 3 * len(params), sorted(tensors)
    nn = torch.nn
    net = nn.Sequential(nn.Conv2d(1, 4, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2, 2),
                        nn.Flatten(), nn.Linear(64, 16), nn.GELU(approximate="tanh"),
                        nn.LayerNorm(16, eps=1e-5), nn.Linear(16, 10))
    net.load_state_dict(params, strict=True)
    with open(d + "/input.f32", "rb") as f:
        x = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).reshape(3, 1, 8, 8)
    with open(d + "/expected.f32", "rb") as f:
        want = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).reshape(3, 10)
    with torch.no_grad():
        got = net(x)
    err = (got - want).abs().max().item()
    print("torch_check: %d tensors, max |torch - dgrad| = %.3g" % (len(tensors), err))
    if not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
        print("torch_check: MISMATCH\ntorch:\n%s\ndgrad:\n%s" % (got, want))
        return 1
    return 0


if __name__ == "__main__":
    try:
        import torch
    except ImportError:
        sys.stderr.write("torch_check.py: no torch in %s\n" % sys.executable)
        sys.exit(77)
    sys.exit(main())
