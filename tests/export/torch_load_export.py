#!/usr/bin/python3
"""The exports load in PyTorch as they are and reproduce `dilococtl eval --full`.

Trains a tiny model with `dilococtl train` on a small corpus written here, evaluates it on the
whole validation split with `dilococtl eval --full --json`, exports both layouts, then in PyTorch:

  nanogpt   a GPT with nanoGPT's module structure and names; load_state_dict(strict=True)
  hf-gpt2   a GPT with Hugging Face GPT2LMHeadModel's names and Conv1D convention (y = x @ W + b),
            its shape read from the exported config.json (transformers itself is not installed
            here; this model uses the same key names and orientation)

and computes the validation loss over the same windows (daemon/export/model_eval.h: consecutive
non-overlapping windows of block_size tokens, the last one shorter), which must agree with
dilococtl's to 1e-4 relative. Safetensors files are read by the small parser below (8-byte
little-endian header length, JSON header, raw little-endian data), not the safetensors package.

  /usr/bin/python3 tests/export/torch_load_export.py build/bin/dilococtl [WORK_DIR]

Exit 0: passed; 77: skipped (no torch or numpy: Debian's python3-torch, visible to
/usr/bin/python3); anything else: failed.
"""

import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

SKIP = 77
try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: torch_load_export needs PyTorch and numpy for /usr/bin/python3 (Debian's python3-torch): {e}")
    sys.exit(SKIP)

MODEL = {"n_layer": 2, "n_embd": 24, "n_head": 3, "block_size": 16}
REL_TOL = 1e-4


def fail(message):
    print(f"torch_load_export: FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def run(args, cwd):
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        fail(f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def read_safetensors(path):
    """(tensors by name as float32 torch tensors, metadata) from a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    data = blob[8 + n:]
    tensors = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            fail(f"{path}: {name} is {t['dtype']}, expected F32")
        b, e = t["data_offsets"]
        array = np.frombuffer(data[b:e], dtype="<f4").reshape(t["shape"]).copy()
        tensors[name] = torch.from_numpy(array)
    return tensors, metadata


# --- nanoGPT's GPT (names as nanoGPT's model.py; nn.Linear weights are [out, in]) ---------------


def nanogpt_model(cfg):
    nn, F = torch.nn, torch.nn.functional
    C, NH = cfg["n_embd"], cfg["n_head"]

    class CausalSelfAttention(nn.Module):

        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(C, 3 * C)
            self.c_proj = nn.Linear(C, C)

        def forward(self, x):
            return self.c_proj(attention(self.c_attn(x), NH))

    class MLP(nn.Module):

        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(C, 4 * C)
            self.c_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):

        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C, eps=cfg["eps"])
            self.attn = CausalSelfAttention()
            self.ln_2 = nn.LayerNorm(C, eps=cfg["eps"])
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):

        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict({
                "wte": nn.Embedding(cfg["vocab_size"], C),
                "wpe": nn.Embedding(cfg["block_size"], C),
                "h": nn.ModuleList(Block() for _ in range(cfg["n_layer"])),
                "ln_f": nn.LayerNorm(C, eps=cfg["eps"]),
            })
            self.lm_head = nn.Linear(C, cfg["vocab_size"], bias=False)
            self.transformer.wte.weight = self.lm_head.weight  # tied, as nanoGPT

        def forward(self, idx):
            x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.size(1)))
            for block in self.transformer.h:
                x = block(x)
            return self.lm_head(self.transformer.ln_f(x))

    return GPT()


# --- Hugging Face GPT-2's names with Conv1D (weight [in, out], y = x @ W + b) ----------------------


def hf_gpt2_model(config):
    nn = torch.nn
    C, NH = config["n_embd"], config["n_head"]
    if config["activation_function"] != "gelu_new":
        fail(f"config.json activation_function {config['activation_function']}, expected gelu_new (tanh GELU)")

    def gelu_new(x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

    class Conv1D(nn.Module):

        def __init__(self, nf, nx):
            super().__init__()
            self.weight = nn.Parameter(torch.empty(nx, nf))
            self.bias = nn.Parameter(torch.zeros(nf))

        def forward(self, x):
            return x @ self.weight + self.bias

    class GPT2Attention(nn.Module):

        def __init__(self):
            super().__init__()
            self.c_attn = Conv1D(3 * C, C)
            self.c_proj = Conv1D(C, C)

        def forward(self, x):
            return self.c_proj(attention(self.c_attn(x), NH))

    class GPT2MLP(nn.Module):

        def __init__(self):
            super().__init__()
            self.c_fc = Conv1D(4 * C, C)
            self.c_proj = Conv1D(C, 4 * C)

        def forward(self, x):
            return self.c_proj(gelu_new(self.c_fc(x)))

    class GPT2Block(nn.Module):

        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(C, eps=config["layer_norm_epsilon"])
            self.attn = GPT2Attention()
            self.ln_2 = nn.LayerNorm(C, eps=config["layer_norm_epsilon"])
            self.mlp = GPT2MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT2Model(nn.Module):

        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(config["vocab_size"], C)
            self.wpe = nn.Embedding(config["n_positions"], C)
            self.h = nn.ModuleList(GPT2Block() for _ in range(config["n_layer"]))
            self.ln_f = nn.LayerNorm(C, eps=config["layer_norm_epsilon"])

    class GPT2LMHeadModel(nn.Module):

        def __init__(self):
            super().__init__()
            self.transformer = GPT2Model()
            self.lm_head = nn.Linear(C, config["vocab_size"], bias=False)
            if config.get("tie_word_embeddings", True):
                self.lm_head.weight = self.transformer.wte.weight

        def forward(self, idx):
            t = self.transformer
            x = t.wte(idx) + t.wpe(torch.arange(idx.size(1)))
            for block in t.h:
                x = block(x)
            return self.lm_head(t.ln_f(x))

    return GPT2LMHeadModel()


def attention(qkv, n_head):
    """Causal multi-head attention of stacked q, k, v (B, T, 3C) -> (B, T, C)."""
    B, T, C3 = qkv.size()
    C = C3 // 3
    q, k, v = qkv.split(C, dim=2)
    hs = C // n_head
    q, k, v = (y.view(B, T, n_head, hs).transpose(1, 2) for y in (q, k, v))
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    att = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
    return (att @ v).transpose(1, 2).contiguous().view(B, T, C)


def full_split_loss(model, val, T):
    """Mean cross-entropy over the windows of model_eval.h's full mode (float64 sums)."""
    n = len(val)
    windows = [(b, min(T, n - 1 - b)) for b in range(0, n - 1, T)]
    total, count = 0.0, 0
    with torch.no_grad():
        for length in sorted({l for _, l in windows}):
            rows = [b for b, l in windows if l == length]
            idx = torch.tensor([list(val[b:b + length]) for b in rows], dtype=torch.long)
            tgt = torch.tensor([list(val[b + 1:b + length + 1]) for b in rows], dtype=torch.long)
            logits = model(idx)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)).double(), tgt.reshape(-1),
                                                     reduction="sum")
            total += loss.item()
            count += tgt.numel()
    if count != n - 1:
        fail(f"the windows scored {count} targets, the split has {n - 1}")
    return total / count


def check_close(name, got, want):
    rel = abs(got - want) / max(abs(want), 1e-12)
    print(f"{name}: torch {got:.7f} vs dilococtl eval {want:.7f} (relative difference {rel:.2e})")
    if not rel <= REL_TOL:
        fail(f"{name}: relative difference {rel:.3e} > {REL_TOL}")


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: torch_load_export.py DILOCOCTL [WORK_DIR]")
    dilococtl = os.path.abspath(sys.argv[1])
    work = tempfile.mkdtemp(prefix="torch_load_export_", dir=sys.argv[2] if len(sys.argv) > 2 else None)
    try:
        torch.manual_seed(0)
        torch.set_num_threads(1)
        # A small corpus of its own (the test needs nothing outside the repository).
        lines = [f"{i:03d}: now is the winter of our discontent, made glorious summer by this sun.\n" for i in range(80)]
        with open(os.path.join(work, "corpus.txt"), "w") as f:
            f.write("".join(lines))
        with open(os.path.join(work, "run.yaml"), "w") as f:
            f.write("model: {n_layer: %d, n_embd: %d, n_head: %d, block_size: %d}\n" %
                    (MODEL["n_layer"], MODEL["n_embd"], MODEL["n_head"], MODEL["block_size"]))
            f.write("data: {corpus: corpus.txt}\n"
                    "train: {batch_size: 4, steps: 40, warmup_steps: 4, lr: 3.0e-3, threads: 1}\n"
                    "eval: {batches: 2}\n")
        run([dilococtl, "train", "run.yaml", "--out", "run", "--json"], work)
        ev = json.loads(run([dilococtl, "eval", "run", "--full", "--json", "--threads", "1"], work).strip().splitlines()[-1])
        for key in ("val_loss", "batches", "tokens", "bits_per_byte"):
            if key not in ev:
                fail(f"dilococtl eval --json has no {key}: {ev}")
        if ev["tokens"] != ev["val_tokens"] - 1:
            fail(f"eval --full scored {ev['tokens']} tokens of a {ev['val_tokens']}-token split")
        with open(ev["corpus"], "rb") as f:
            corpus = f.read()
        val = corpus[ev["val_begin"]:ev["val_begin"] + ev["val_tokens"]]
        if len(val) != ev["val_tokens"] or ev["val_begin"] + ev["val_tokens"] != len(corpus):
            fail(f"the split [{ev['val_begin']}, +{ev['val_tokens']}) is not the tail of {ev['corpus']}")

        # nanoGPT layout: load_state_dict, strict.
        run([dilococtl, "export", "run", "--format", "safetensors", "-o", "nanogpt.safetensors"], work)
        sd, meta = read_safetensors(os.path.join(work, "nanogpt.safetensors"))
        for key, want in (("layout", "nanogpt"), ("tied_head", "true"), ("activation", "gelu_tanh"),
                          ("layer_norm_eps", "1e-05"), ("training_steps", "40"), ("merges", "0"), ("format", "pt")):
            if meta.get(key) != want:
                fail(f"nanogpt metadata {key} = {meta.get(key)!r}, expected {want!r}")
        cfg = {k: int(meta[k]) for k in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")}
        cfg["eps"] = float(meta["layer_norm_eps"])
        if not torch.equal(sd["lm_head.weight"], sd["transformer.wte.weight"]):
            fail("lm_head.weight is not a copy of transformer.wte.weight")
        nano = nanogpt_model(cfg)
        nano.load_state_dict(sd, strict=True)
        nano.eval()
        nano_loss = full_split_loss(nano, val, cfg["block_size"])
        check_close("nanogpt", nano_loss, ev["val_loss"])

        # hf-gpt2 layout: a directory with model.safetensors and config.json.
        run([dilococtl, "export", "run", "--format", "safetensors", "--layout", "hf-gpt2", "-o", "hf"], work)
        with open(os.path.join(work, "hf", "config.json")) as f:
            config = json.load(f)
        if config.get("model_type") != "gpt2" or config.get("architectures") != ["GPT2LMHeadModel"]:
            fail(f"config.json is not a GPT-2 config: {config}")
        hf_sd, hf_meta = read_safetensors(os.path.join(work, "hf", "model.safetensors"))
        if hf_meta.get("layout") != "hf-gpt2":
            fail(f"hf-gpt2 metadata layout = {hf_meta.get('layout')!r}")
        hf = hf_gpt2_model(config)
        hf.load_state_dict(hf_sd, strict=True)
        hf.eval()
        hf_loss = full_split_loss(hf, val, config["n_positions"])
        check_close("hf-gpt2", hf_loss, ev["val_loss"])
        print("torch_load_export: both layouts load strictly and reproduce dilococtl eval --full")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
