#!/usr/bin/python3
"""Parity of our GPT with PyTorch: writes tests/fixtures/torch_parity.json.

Builds a tiny initial checkpoint with our engine (`dilococtl train`, train.steps
0), loads its parameters into the same GPT written in PyTorch (nanoGPT
structure, float32), runs one batch forward and backward with mean
cross-entropy, and records the loss and the L2 norm of every tensor's gradient
(by our tensor names), once with the initial parameters and once with them
times 4 (PARAM_SCALES). tests/model/test_torch_parity.cpp checks our engine
against that file without needing torch. Deterministic: re-running it gives
the same file.

  /usr/bin/python3 scripts/torch_parity.py                     # regenerate the fixture
  /usr/bin/python3 scripts/torch_parity.py --checkpoint PATH   # from an existing initial checkpoint

Needs build/bin/dilococtl (scripts/setup.sh) unless --checkpoint is given, and
PyTorch (Debian's python3-torch is visible to /usr/bin/python3 only).
"""

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import torch
    import yaml
except ImportError as e:
    sys.exit(f"torch_parity: {e}: run with /usr/bin/python3 (Debian's python3-torch, python3-numpy, python3-yaml)")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "tests", "fixtures", "torch_parity.json")
DEFAULT_BINARY = os.path.join(REPO, "build", "bin", "dilococtl")

# The generated model: odd shapes (head size 8 with 3 heads, C not a power of 2).
MODEL = {"n_layer": 2, "n_embd": 24, "n_head": 3, "block_size": 16}
SEED = 1337
B, T = 2, 16
# Row b of the batch: inputs are bytes [b*T, (b+1)*T) of this text, targets the
# same shifted by one.
BATCH_TEXT = "First Citizen: Before we proceed any further, hear me speak."
# Each case multiplies every initial parameter by a scale (a power of 2, so
# exactly). At GPT-2 init the MLP pre-activations are ~0.1, where GELU is
# nearly quadratic: the exact (erf) GELU or a 5% error in its cubic constant
# moves no gradient norm by 1e-4. At x4 they are O(1) and move some by 3e-4 to
# 1e-3, while float32 rounding stays below 1e-6.
PARAM_SCALES = [1, 4]

# Checkpoint format (daemon/train/checkpoint.h).
HEADER_FORMAT = "<8sII5iqqQQQII"
HEADER_BYTES = 84
MAGIC = b"DLCKPT01"
VERSION = 1
DTYPE_F32 = 1
BLOCK_TENSORS = [
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
    "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias",
]  # yapf: disable


def die(message):
    print(f"torch_parity: {message}", file=sys.stderr)
    sys.exit(1)


# --- our formats --------------------------------------------------------------


def tensor_table(cfg):
    """(name, shape, offset) in gpt_tensor_table order (kernels/gpt.cpp)."""
    C = cfg["n_embd"]
    shapes = [("wte", [cfg["vocab_size"], C]), ("wpe", [cfg["block_size"], C])]
    block = [[C], [C], [3 * C, C], [3 * C], [C, C], [C], [C], [C], [4 * C, C], [4 * C], [C, 4 * C], [C]]
    for l in range(cfg["n_layer"]):
        shapes += [(f"h.{l}.{name}", shape) for name, shape in zip(BLOCK_TENSORS, block)]
    shapes += [("ln_f.weight", [C]), ("ln_f.bias", [C])]
    table, offset = [], 0
    for name, shape in shapes:
        table.append((name, shape, offset))
        offset += math.prod(shape)
    return table, offset


def table_digest(table):
    """TensorTable::digest(): FNV-1a 64 over name + NUL, int64 dims, u64 offset."""
    h = 0xCBF29CE484222325
    for name, shape, offset in table:
        data = name.encode() + b"\0" + b"".join(struct.pack("<q", d) for d in shape) + struct.pack("<Q", offset)
        for byte in data:
            h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


def crc32c(data, table=_crc32c_table()):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def read_checkpoint(path):
    """Verifies an initial checkpoint; returns (model config, params, run config)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < HEADER_BYTES:
        die(f"{path}: {len(blob)} bytes, shorter than the {HEADER_BYTES}-byte header")
    (magic, version, dtype, vocab_size, block_size, n_layer, n_embd, n_head, step, adam_step, n_params, digest,
     yaml_bytes, body_crc, header_crc) = struct.unpack(HEADER_FORMAT, blob[:HEADER_BYTES])
    if magic != MAGIC:
        die(f"{path}: magic {magic!r}, expected {MAGIC!r}: not a checkpoint")
    if version != VERSION or dtype != DTYPE_F32:
        die(f"{path}: format version {version} dtype {dtype}; this script reads version {VERSION}, dtype float32")
    if crc32c(blob[:80]) != header_crc:
        die(f"{path}: header CRC mismatch (corrupt file)")
    expected_size = HEADER_BYTES + yaml_bytes + 12 * n_params
    if len(blob) != expected_size:
        die(f"{path}: {len(blob)} bytes, expected {expected_size} (84 + {yaml_bytes} + 12 * {n_params})")
    if crc32c(blob[HEADER_BYTES:]) != body_crc:
        die(f"{path}: body CRC mismatch (corrupt file)")
    cfg = {"vocab_size": vocab_size, "block_size": block_size, "n_layer": n_layer, "n_embd": n_embd, "n_head": n_head}
    table, numel = tensor_table(cfg)
    if numel != n_params or table_digest(table) != digest:
        die(f"{path}: tensor table ({n_params} params, digest {digest:#x}) differs from this script's "
            f"({numel}, {table_digest(table):#x}): update tensor_table() to match kernels/gpt.cpp")
    if step != 0 or adam_step != 0:
        die(f"{path}: taken at step {step}; the fixture needs an initial model (train.steps: 0)")
    run_config = yaml.safe_load(blob[HEADER_BYTES:HEADER_BYTES + yaml_bytes].decode())
    params = np.frombuffer(blob, "<f4", count=n_params, offset=HEADER_BYTES + yaml_bytes).copy()
    return cfg, params, run_config


def make_checkpoint(binary, workdir):
    if not os.access(binary, os.X_OK):
        die(f"{binary} not found: run scripts/setup.sh first (or pass --checkpoint PATH)")
    corpus = os.path.join(workdir, "corpus.txt")
    with open(corpus, "w") as f:
        f.write("The quick brown fox jumps over the lazy dog. 0123456789\n" * 64)
    config = os.path.join(workdir, "parity.yaml")
    with open(config, "w") as f:
        yaml.safe_dump({
            "model": MODEL,
            "data": {"corpus": corpus},
            "train": {"batch_size": B, "steps": 0, "seed": SEED, "threads": 1},
            "eval": {"batches": 1},
        }, f)
    run_dir = os.path.join(workdir, "run")
    proc = subprocess.run([binary, "train", config, "--out", run_dir], capture_output=True, text=True)
    if proc.returncode != 0:
        die(f"dilococtl train failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return os.path.join(run_dir, "checkpoint.bin")


# --- the GPT in PyTorch (nanoGPT) ---------------------------------------------


def build_torch_gpt(cfg):
    nn, F = torch.nn, torch.nn.functional

    class CausalSelfAttention(nn.Module):

        def __init__(self):
            super().__init__()
            self.n_head, self.n_embd = cfg["n_head"], cfg["n_embd"]
            self.c_attn = nn.Linear(self.n_embd, 3 * self.n_embd)
            self.c_proj = nn.Linear(self.n_embd, self.n_embd)

        def forward(self, x):
            Bx, Tx, C = x.size()
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            hs = C // self.n_head
            q, k, v = (y.view(Bx, Tx, self.n_head, hs).transpose(1, 2) for y in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            mask = torch.tril(torch.ones(Tx, Tx, dtype=torch.bool))
            att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(Bx, Tx, C)
            return self.c_proj(y)

    class Mlp(nn.Module):

        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(cfg["n_embd"], 4 * cfg["n_embd"])
            self.c_proj = nn.Linear(4 * cfg["n_embd"], cfg["n_embd"])

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):

        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(cfg["n_embd"], eps=1e-5)
            self.attn = CausalSelfAttention()
            self.ln_2 = nn.LayerNorm(cfg["n_embd"], eps=1e-5)
            self.mlp = Mlp()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Gpt(nn.Module):

        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict({
                "wte": nn.Embedding(cfg["vocab_size"], cfg["n_embd"]),
                "wpe": nn.Embedding(cfg["block_size"], cfg["n_embd"]),
                "h": nn.ModuleList(Block() for _ in range(cfg["n_layer"])),
                "ln_f": nn.LayerNorm(cfg["n_embd"], eps=1e-5),
            })
            self.lm_head = nn.Linear(cfg["n_embd"], cfg["vocab_size"], bias=False)
            self.lm_head.weight = self.transformer.wte.weight  # tied

        def forward(self, idx, targets):
            pos = torch.arange(idx.size(1))
            x = self.transformer.wte(idx) + self.transformer.wpe(pos)
            for block in self.transformer.h:
                x = block(x)
            logits = self.lm_head(self.transformer.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return Gpt()


def our_name(torch_name):
    """transformer.h.0.attn.c_attn.weight -> h.0.attn.c_attn.weight; wte.weight -> wte."""
    name = torch_name.removeprefix("transformer.")
    return {"wte.weight": "wte", "wpe.weight": "wpe"}.get(name, name)


def to_json(value, indent=""):
    """JSON with each container on one line when it fits in 100 columns."""
    flat = json.dumps(value)
    if len(indent) + len(flat) <= 100 or not isinstance(value, (dict, list)) or not value:
        return flat
    inner = indent + "  "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {to_json(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    items = [inner + to_json(v, inner) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + indent + "]"


def sig(x, digits=9):
    """Rounds torch results so the file does not churn on last-bit differences."""
    return float(f"{x:.{digits}g}")


def run_case(cfg, table, params, scale, inputs, targets):
    """Loss and gradient norms of one batch with every parameter times scale."""
    model = build_torch_gpt(cfg)
    by_name = {our_name(n): p for n, p in model.named_parameters()}  # the tied lm_head is listed once
    if sorted(by_name) != sorted(name for name, _, _ in table):
        die(f"PyTorch parameters {sorted(by_name)} differ from our tensor table")
    with torch.no_grad():
        for name, shape, offset in table:
            p = by_name[name]
            if list(p.shape) != shape:
                die(f"{name}: PyTorch shape {list(p.shape)}, ours {shape}")
            p.copy_(torch.from_numpy(params[offset:offset + math.prod(shape)].reshape(shape)) * scale)
    loss = model(torch.tensor(inputs), torch.tensor(targets))
    loss.backward()  # wte.grad: embedding + LM head, since they are one tensor
    return {
        "param_scale": scale,
        "loss": sig(loss.item()),
        "grad_norms": {name: sig(torch.linalg.norm(by_name[name].grad.double()).item()) for name, _, _ in table},
    }

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="an existing initial checkpoint (train.steps: 0) instead of a new one")
    parser.add_argument("--dilococtl", default=DEFAULT_BINARY, help="the binary that makes the checkpoint")
    parser.add_argument("--out", default=DEFAULT_OUT, help="the fixture to write")
    args = parser.parse_args()
    torch.set_num_threads(1)  # a fixed reduction order: the same file on every run

    if args.checkpoint:
        cfg, params, run_config = read_checkpoint(args.checkpoint)
    else:
        with tempfile.TemporaryDirectory(prefix="torch_parity.") as workdir:
            cfg, params, run_config = read_checkpoint(make_checkpoint(args.dilococtl, workdir))
    seed = run_config["train"]["seed"]
    if len(BATCH_TEXT) < B * T + 1 or T > cfg["block_size"]:
        die(f"the batch ({B}x{T}) does not fit the text or the model's block_size {cfg['block_size']}")

    table, _ = tensor_table(cfg)
    data = list(BATCH_TEXT.encode())
    inputs = [data[b * T:(b + 1) * T] for b in range(B)]
    targets = [data[b * T + 1:(b + 1) * T + 1] for b in range(B)]
    cases = [run_case(cfg, table, params, scale, inputs, targets) for scale in PARAM_SCALES]

    p64 = params.astype(np.float64)
    fixture = {
        "about": "PyTorch reference for tests/model/test_torch_parity.cpp; do not edit by hand",
        "command": "/usr/bin/python3 scripts/torch_parity.py" +
                   (f" --checkpoint {args.checkpoint}" if args.checkpoint else ""),
        "torch_version": torch.__version__,
        "config": cfg,
        "seed": seed,
        # Fingerprint of the initial parameters (Gpt::init_weights(seed)).
        "params": {
            "count": int(params.size),
            "sum": math.fsum(p64),
            "sum_squares": math.fsum(p64 * p64),
            "first": [float(x) for x in params[:8]],
        },
        "tensors": [{"name": name, "shape": shape} for name, shape, _ in table],
        "batch": {"B": B, "T": T, "inputs": inputs, "targets": targets},
        "cases": cases,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(to_json(fixture) + "\n")

    print(f"torch_parity: torch {torch.__version__}, model {cfg}, seed {seed}, {params.size} params, "
          f"batch {B}x{T} (ln 256 = {math.log(256):.6f})")
    for case in cases:
        norms = case["grad_norms"].values()
        print(f"torch_parity: params x{case['param_scale']}: loss {case['loss']:.6f}, {len(norms)} gradient norms "
              f"in [{min(norms):.3g}, {max(norms):.3g}]")
    shown = os.path.relpath(args.out, REPO) if os.path.abspath(args.out).startswith(REPO + os.sep) else args.out
    print(f"torch_parity: wrote {shown} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
