#!/usr/bin/python3
"""PyTorch counterpart of bench/gpt.c: the same transformer step, the same JSON line.

The default model of examples/transformer: token embedding (114, 128) + learned
position embedding (64, 128), 4 pre-LN GPT-2 blocks (LayerNorm, causal
self-attention with 4 heads through c_attn (C -> 3C) and c_proj, LayerNorm, MLP
C -> 4C -> C with tanh-GELU), final LayerNorm, untied linear head without bias;
cross-entropy; torch.optim.AdamW with its defaults. One step = zero_grad +
forward + backward + optimizer step on a fixed random (16, 64) batch.

    /usr/bin/python3 bench/gpt_torch.py [--batch N] [--threads T] [--steps S] [--warmup W]

Run with /usr/bin/python3 (Debian's python3-torch 1.13). OMP_WAIT_POLICY is
read from the environment (it must be set before torch starts) and reported.
As in mlp_torch.py, OPENBLAS_NUM_THREADS is set to --threads before torch loads
(Debian's torch does its GEMMs in OpenBLAS, whose pool torch.set_num_threads
does not reach); --blas-threads overrides it (0: OpenBLAS default).
"""
import argparse
import math

from torch_setup import add_thread_args, import_torch, report, time_steps


def build(torch, nn, V, L, H, C, T):
    F = nn.functional

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(C, 3 * C)
            self.c_proj = nn.Linear(C, C)
            self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)))

        def forward(self, x):
            B, t, _ = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q = q.view(B, t, H, C // H).transpose(1, 2)
            k = k.view(B, t, H, C // H).transpose(1, 2)
            v = v.view(B, t, H, C // H).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // H))
            att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, t, C)
            return self.c_proj(y)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C)
            self.attn = Attn()
            self.ln_2 = nn.LayerNorm(C)
            self.c_fc = nn.Linear(C, 4 * C)
            self.gelu = nn.GELU(approximate="tanh")
            self.c_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.c_proj(self.gelu(self.c_fc(self.ln_2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(V, C)
            self.wpe = nn.Embedding(T, C)
            self.h = nn.ModuleList([Block() for _ in range(L)])
            self.ln_f = nn.LayerNorm(C)
            self.lm_head = nn.Linear(C, V, bias=False)
            self.register_buffer("pos", torch.arange(T))

        def forward(self, idx):
            t = idx.shape[1]
            x = self.wte(idx) + self.wpe(self.pos[:t])
            for b in self.h:
                x = b(x)
            return self.lm_head(self.ln_f(x))

    return GPT()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=114)
    add_thread_args(ap)
    a = ap.parse_args()
    torch, nn, blas = import_torch(a, "gpt_torch.py")
    model = build(torch, nn, a.vocab, a.layers, a.heads, a.dim, a.context)
    opt = torch.optim.AdamW(model.parameters())
    g = torch.Generator().manual_seed(42)
    x = torch.randint(0, a.vocab, (a.batch, a.context), generator=g)
    y = torch.randint(0, a.vocab, (a.batch, a.context), generator=g)

    def step():
        opt.zero_grad()
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.view(-1, a.vocab), y.view(-1))
        loss.backward()
        opt.step()
        return loss

    done, wall, cpu, loss = time_steps(step, a.warmup, a.steps)
    report(a, blas, done, wall, cpu, loss, model="gpt",
           tokens_per_s=round(done * a.batch * a.context / wall))

if __name__ == "__main__":
    main()
