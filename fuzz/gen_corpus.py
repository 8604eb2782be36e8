#!/usr/bin/env python3
"""Writes the seed corpora of fuzz/corpus/<harness>/ (valid inputs of each
format, so the fuzzers start past the first checks). Inputs that found
defects are kept beside them under names starting with "crash-"; this script
never deletes files. Run from anywhere: python3 fuzz/gen_corpus.py"""
import gzip, hashlib, hmac, json, os, struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(harness, name, data):
    d = os.path.join(ROOT, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# ---- TCPStore (dg__ts_server_replay records: client, length, bytes) ----
def u64(v):
    return struct.pack("<Q", v & (2**64 - 1))


def bts(b):
    return u64(len(b)) + b


def rec(client, payload, hangup=False):
    out = b""
    while True:  # a record holds at most 255 bytes
        chunk, payload = payload[:255], payload[255:]
        out += bytes([client | (4 if hangup and not payload else 0), len(chunk)]) + chunk
        if not payload:
            return out


SET, CAS, GET, ADD, CHECK, WAIT, NUMKEYS, WATCH, DELETE = range(9)


def keys(q, *ks):
    return bytes([q]) + u64(len(ks)) + b"".join(bts(k) for k in ks)


def store_seeds(tok):
    s = {}
    s["set_get"] = rec(0, bytes([SET]) + bts(b"/a") + bts(b"hello") + bytes([GET]) + bts(b"/a"))
    s["add"] = rec(0, bytes([ADD]) + bts(b"init/") + u64(1) + bytes([ADD]) + bts(b"init/") + u64(-3))
    s["wait_release"] = rec(0, keys(WAIT, b"/k1", b"/k2")) + rec(1, bytes([SET]) + bts(b"/k1") + bts(b"1")) + \
        rec(1, bytes([SET]) + bts(b"/k2") + bts(b"2")) + rec(0, keys(CHECK, b"/k1"))
    s["cas"] = rec(0, bytes([CAS]) + bts(b"/c") + bts(b"") + bts(b"x") + bytes([CAS]) + bts(b"/c") + bts(b"x") + bts(b"y"))
    s["misc"] = rec(0, bytes([NUMKEYS, DELETE]) + bts(b"/a") + keys(CHECK, b"/a", b"") + bytes([GET]) + bts(b"/missing"))
    s["split"] = rec(0, bytes([SET]) + u64(2)[:3]) + rec(0, u64(2)[3:] + b"/z" + bts(b"v"), hangup=True) + \
        rec(1, bytes([GET]) + bts(b"/z"))
    if tok:
        cn = bytes(range(16))
        sn = bytes(16)  # the replay's server nonce
        mac = hmac.new(tok, b"dgrad tcp store client\0" + cn + sn, hashlib.sha256).digest()
        hello = keys(CHECK, b"\0dgrad-auth-hello" + cn)
        proof = keys(CHECK, b"\0dgrad-auth-proof" + mac)
        s["auth_ok"] = rec(0, hello + proof + bytes([SET]) + bts(b"/a") + bts(b"1")) + rec(1, hello)
        s["auth_bad"] = rec(0, hello + keys(CHECK, b"\0dgrad-auth-proof" + bytes(32)))
        s["auth_skip"] = rec(0, bytes([SET]) + bts(b"/a") + bts(b"1"))
    return s


for name, data in store_seeds(None).items():
    put("fuzz_store", name, b"\0" + data)
for name, data in store_seeds(b"fuzz-token").items():
    put("fuzz_store", "tok_" + name, b"\1" + data)

# ---- Gloo frames: 48-byte headers (nbytes, opcode, slot, offset, length, roffset) ----
SEND_UNBOUND, SEND_READY, RECV_READY = 1, 2, 3
BYE, ABORT, EAGER = 0x4447425945, 0x444741424F5254, 0x444745414752


def hdr(nbytes, op, slot, off=0, length=0, roff=0):
    return struct.pack("<6Q", nbytes, op, slot, off, length, roff)


def data(slot, payload):
    return hdr(48 + len(payload), SEND_UNBOUND, slot, 0, len(payload)) + payload


gloo = {
    "recv_ready": hdr(48, RECV_READY, 1, 0, 32),
    "send_ready_data": hdr(48, SEND_READY, 1, 0, 64) + data(1, bytes(range(64))),
    "all": hdr(48, RECV_READY, 1, 0, 32) + data(1, b"x" * 64) + data(2, b"y" * 16) +
    data(3, b"z" * 8) + data(0x100000001, b""),
    "short": data(1, b"abc"),
    "too_long": data(1, bytes(80)),
    "bad_nbytes": hdr(47, RECV_READY, 1, 0, 32),
}
for name, d in gloo.items():
    put("fuzz_gloo", name, b"\x1f" + d)
    put("fuzz_gloo", name + "_noslot3", b"\x10" + d)


def eager(slot, payload):
    return hdr(48 + len(payload), EAGER, slot, 0, len(payload)) + payload


ctrl = {
    "bye": hdr(48, BYE, 0),
    "abort": hdr(48, ABORT, 1, 10),
    "abort_blame_self": hdr(48, ABORT, 0, 9),
    "abort_bad": hdr(48, ABORT, 2**63, 2**40),
    "eager": eager(2, b"e" * 16) + eager(3, b"f" * 8) + hdr(48, BYE, 0),
    "eager_early": eager(7, b"q" * 100) + hdr(48, RECV_READY, 1, 0, 32) + data(1, bytes(64)),
    "eager_send": hdr(48, RECV_READY, 1, 0, 32) + eager(2, b"") + hdr(48, BYE, 0),
}
for name, d in ctrl.items():
    put("fuzz_ctrl", name, b"\x1f" + d)
    put("fuzz_ctrl", name + "_plain", b"\x01" + d)

# ---- safetensors ----
def safetensors(tensors, meta):
    hdrd, body = {}, b""
    for name, (shape, vals) in tensors.items():
        raw = struct.pack("<%df" % len(vals), *vals)
        hdrd[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(body), len(body) + len(raw)]}
        body += raw
    hdrd["__metadata__"] = meta
    h = json.dumps(hdrd).encode()
    return struct.pack("<Q", len(h)) + h + body


w, b = ([2, 3], [0.5] * 6), ([3], [1.0, 2.0, 3.0])
put("fuzz_safetensors", "params", safetensors({"w": w, "b": b}, {"__step": "3"}))
put("fuzz_safetensors", "renamed", safetensors({"model.w": w, "model.b": b}, {}))
put("fuzz_safetensors", "adamw", safetensors(
    {"w": w, "b": b, "optim.exp_avg.w": w, "optim.exp_avg.b": b, "optim.exp_avg_sq.w": w,
     "optim.exp_avg_sq.b": b}, {"__step": "1", "__optim": "adamw", "__optim_step": "1",
                                 "__lr": "0.001"}))
esc = rb'{"w\u0041":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"__metadata__":{"k\n":"v\"\u00e9"}}'
put("fuzz_safetensors", "escapes", struct.pack("<Q", len(esc)) + esc + bytes(4))

# ---- IDX: first byte 0 raw, 1 compressed by the harness, 2 compressed and cut ----
def idx(t, dims, payload):
    return bytes([0, 0, t, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + payload


u8 = idx(0x08, [2, 3], bytes(range(6)))
i32 = idx(0x0C, [2], struct.pack(">2i", -1, 7))
f64 = idx(0x0E, [1, 1, 1], struct.pack(">d", 3.5))
for name, d in {"u8": u8, "i32": i32, "f64": f64, "empty_dim": idx(0x08, [0, 5], b"")}.items():
    put("fuzz_idx", name, b"\0" + d)
    put("fuzz_idx", name + "_gz", b"\1" + d)
    put("fuzz_idx", name + "_gzfile", b"\0" + gzip.compress(d))
put("fuzz_idx", "u8_gzcut", b"\2\x05" + u8)

# ---- text ----
put("fuzz_text", "fortune", b"\x1a" + b"Q: What is the sound of one hand clapping?\nA: A.\n%\n")
put("fuzz_text", "bytes", b"\x83" + bytes(range(256)) * 2)
put("fuzz_text", "two", b"\x00ab")
