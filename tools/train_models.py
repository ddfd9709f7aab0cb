#!/usr/bin/python3
"""Train the course's bundled byte-level Llama models on Debian's fortunes.

This is a tool, not part of the course: CI never runs it. It regenerates
everything under models/ from a seed:

    /usr/bin/python3 tools/train_models.py --out models --steps 1200

and, to continue training the target from the bundled weights (a new warmup and cosine decay):

    /usr/bin/python3 tools/train_models.py --out models --only target \
        --init-from models/tiny-fortunes --steps 800 --lr 1e-3

It needs Debian's python3-torch, libopenblas0-pthread and fortunes packages
(`./course setup --trainer` installs them). On 2 cores the target takes most
of an hour; the draft a few minutes.

What it writes, per model (models/<name>/):
    config.json         Hugging Face Llama keys (LlamaForCausalLM)
    model.safetensors   float32 tensors with Hugging Face names
    golden.json         fixtures from this PyTorch model: token ids, logits at
                        chosen positions, and greedy continuations
    training.json       what was done and measured (steps, time, bits/byte)

The architecture is exactly the one the C++ engine implements: RMSNorm,
rotate-half RoPE, grouped-query causal attention, a SwiGLU MLP, an untied
output head. The byte vocabulary is 259: 0 unk, 1 BOS, 2 EOS, byte b = b + 3.
"""
import argparse
import json
import math
import os
import struct
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from fortunes_corpus import HELDOUT_EVAL, load_fortunes, split

UNK, BOS, EOS, BYTE_OFFSET, VOCAB = 0, 1, 2, 3, 259


# ---------------------------------------------------------------- corpus ---


def encode(text):
    return [b + BYTE_OFFSET for b in text.encode("utf-8")]


def decode(ids):
    return bytes(i - BYTE_OFFSET for i in ids if i >= BYTE_OFFSET).decode("utf-8", errors="replace")


def documents_to_stream(quotes):
    stream = []
    for q in quotes:
        stream.append(BOS)
        stream.extend(encode(q))
        stream.append(EOS)
    return torch.tensor(stream, dtype=torch.long)


# ----------------------------------------------------------------- model ---
class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_tables(seq_len, head_dim, theta, dtype):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_heads, self.n_kv = c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c["hidden_size"] // self.n_heads
        d = c["hidden_size"]
        self.q_proj = nn.Linear(d, self.n_heads * self.hd, bias=False)
        self.k_proj = nn.Linear(d, self.n_kv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, self.n_kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.hd, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        # Query head h reads KV head h // group (Hugging Face's repeat_kv).
        group = self.n_heads // self.n_kv
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        out = scores.softmax(-1) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, h = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(d, h, bias=False)
        self.up_proj = nn.Linear(d, h, bias=False)
        self.down_proj = nn.Linear(h, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c["num_hidden_layers"]) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, ids):
        t = ids.shape[1]
        hd = self.c["hidden_size"] // self.c["num_attention_heads"]
        cos, sin = rope_tables(t, hd, self.c["rope_theta"], self.embed_tokens.weight.dtype)
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))

    def hf_state(self):
        """Tensors under Hugging Face's names, in a stable order."""
        out = {"model.embed_tokens.weight": self.embed_tokens.weight}
        for i, l in enumerate(self.layers):
            p = f"model.layers.{i}."
            out[p + "input_layernorm.weight"] = l.input_layernorm.weight
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                out[p + f"self_attn.{n}.weight"] = getattr(l.self_attn, n).weight
            out[p + "post_attention_layernorm.weight"] = l.post_attention_layernorm.weight
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[p + f"mlp.{n}.weight"] = getattr(l.mlp, n).weight
        out["model.norm.weight"] = self.norm.weight
        out["lm_head.weight"] = self.lm_head.weight
        return out


def hf_config(dim, layers, heads, kv_heads, hidden, context):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": dim,
        "intermediate_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": context,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": VOCAB,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "torch_dtype": "float32",
    }


# --------------------------------------------------------------- writing ---
def write_safetensors(path, tensors, metadata):
    header, blobs, offset = {"__metadata__": metadata}, [], 0
    for name, t in tensors.items():
        data = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)  # keep the data 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)


# -------------------------------------------------------------- training ---
def evaluate_bits_per_byte(model, quotes, context):
    """Held-out cross-entropy in bits per byte: every quote is BOS + bytes + EOS;
    the loss of predicting each byte and the final EOS is summed and divided by
    the number of bytes."""
    model.eval()
    total_bits, total_bytes = 0.0, 0
    with torch.no_grad():
        for q in quotes:
            ids = ([BOS] + encode(q) + [EOS])[: context + 1]
            x = torch.tensor([ids[:-1]])
            y = torch.tensor(ids[1:])
            loss = F.cross_entropy(model(x)[0], y, reduction="sum").item()
            total_bits += loss / math.log(2)
            total_bytes += len(ids) - 2
    model.train()
    return total_bits / max(total_bytes, 1)


def train(model, stream, steps, batch, seq, lr, seed, log_every, label, long_frac=0.2):
    """AdamW with warmup and cosine decay. Most steps use half-length windows
    at twice the batch (attention is cheaper, so more tokens per second); the
    last long_frac of the steps use the full context, so every position the
    engine will use has been trained."""
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, steps // 20)
    start = time.time()
    for step in range(steps):
        frac = step / max(1, steps - 1)
        scale = (step + 1) / warmup if step < warmup else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))
        for group in opt.param_groups:
            group["lr"] = lr * scale
        long_phase = step >= steps * (1 - long_frac)
        b, t = (batch, seq) if long_phase else (batch * 2, seq // 2)
        starts = torch.randint(0, len(stream) - t - 1, (b,), generator=g)
        chunk = torch.stack([stream[s : s + t + 1] for s in starts.tolist()])
        logits = model(chunk[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), chunk[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % log_every == 0 or step == steps - 1:
            el = time.time() - start
            rate = (step + 1) * batch * seq / el
            print(f"[{label}] step {step+1}/{steps} loss {loss.item():.3f} "
                  f"({loss.item()/math.log(2):.2f} bits) {rate:.0f} tok/s {el/60:.1f} min", flush=True)
    return time.time() - start


# -------------------------------------------------------------- fixtures ---
def greedy(model, ids, max_new, context):
    """Greedy continuation; stops after EOS (which is kept) or max_new tokens.
    Also returns the smallest gap between the best and second-best logit on
    the way, so we know how robust the fixture is to float rounding."""
    out, min_gap = [], float("inf")
    with torch.no_grad():
        for _ in range(max_new):
            seq = (ids + out)[-context:]
            logits = model(torch.tensor([seq]))[0, -1]
            top2 = logits.topk(2).values
            min_gap = min(min_gap, (top2[0] - top2[1]).item())
            nxt = int(logits.argmax())
            out.append(nxt)
            if nxt == EOS:
                break
    return out, min_gap


def golden(model, context, prompts, logit_texts, max_new):
    model.eval()
    g = {"vocab_size": VOCAB, "logits": [], "greedy": []}
    with torch.no_grad():
        for text in logit_texts:
            ids = [BOS] + encode(text)
            logits = model(torch.tensor([ids]))[0]
            positions = sorted({0, 1, len(ids) // 2, len(ids) - 1})
            g["logits"].append({
                "text": text, "ids": ids, "positions": positions,
                "logits": [[round(v, 6) for v in logits[p].tolist()] for p in positions],
            })
        for text in prompts:
            ids = [BOS] + encode(text)
            cont, gap = greedy(model, ids, max_new, context)
            g["greedy"].append({"prompt": text, "prompt_ids": ids, "max_new_tokens": max_new,
                                "ids": cont, "text": decode(cont), "min_top2_gap": round(gap, 5)})
    return g


def greedy_agreement(draft, target, quotes, context):
    """How often the draft's argmax equals the target's, over held-out text."""
    agree = total = 0
    with torch.no_grad():
        for q in quotes:
            ids = ([BOS] + encode(q))[:context]
            x = torch.tensor([ids])
            a, b = draft(x)[0].argmax(-1), target(x)[0].argmax(-1)
            agree += int((a == b).sum())
            total += len(ids)
    return agree / max(total, 1)


def sample_text(model, prompt, context, n, seed, temperature=0.8):
    g = torch.Generator().manual_seed(seed)
    ids = [BOS] + encode(prompt)
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([(ids + out)[-context:]]))[0, -1] / temperature
            nxt = int(torch.multinomial(logits.softmax(-1), 1, generator=g))
            if nxt == EOS:
                break
            out.append(nxt)
    return prompt + decode(out)


# ------------------------------------------------------------------ main ---
def save(model, cfg, outdir, name, info, prompts, logit_texts):
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(d, "model.safetensors"), model.hf_state(), {"format": "pt"})
    with open(os.path.join(d, "golden.json"), "w") as f:
        json.dump(golden(model, cfg["max_position_embeddings"], prompts, logit_texts, 96), f)
        f.write("\n")
    with open(os.path.join(d, "training.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="models")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", type=int, default=1200, help="target training steps")
    ap.add_argument("--draft-steps", type=int, default=700)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=["target", "draft", "both"], default="both")
    ap.add_argument("--init-from", help="start the target from this model directory's weights (continue training)")
    ap.add_argument("--lr", type=float, default=2e-3, help="the target's peak learning rate")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    quotes = load_fortunes()
    val, train_q = split(quotes, args.seed)
    stream = documents_to_stream(train_q)
    print(f"{len(quotes)} quotes, {len(stream)} training tokens, {len(val)} held out", flush=True)
    val_eval = val[:HELDOUT_EVAL]  # also models/heldout-fortunes.txt (tools/fortunes_corpus.py)

    prompts = ["The ", "Q: What", "You will ", "Love is", "If you "]
    logit_texts = ["The quick brown fox", "Q: Why did the chicken", "Knowledge is power."]

    target_cfg = hf_config(192, 4, 8, 2, 512, 256)
    draft_cfg = hf_config(96, 2, 4, 2, 256, 256)
    tdir = os.path.join(args.out, "tiny-fortunes")
    target = Llama(target_cfg)
    previous = None
    if args.init_from:
        from_safetensors(target, os.path.join(args.init_from, "model.safetensors"))
        with open(os.path.join(args.init_from, "training.json")) as f:
            previous = json.load(f)
    if args.only in ("target", "both"):
        secs = train(target, stream, args.steps, args.batch, args.seq, args.lr, args.seed, 25, "target")
        bpb = evaluate_bits_per_byte(target, val_eval, 256)
        info = {
            "parameters": sum(p.numel() for p in target.parameters()),
            "steps": args.steps, "batch": args.batch, "seq": args.seq, "seed": args.seed,
            "tokens_seen": args.steps * args.batch * args.seq,
            "training_minutes": round(secs / 60, 1), "threads": args.threads,
            "heldout_bits_per_byte": round(bpb, 3), "heldout_quotes": len(val_eval), "peak_lr": args.lr,
            "torch": torch.__version__,
            "samples_t0.8": [sample_text(target, p, 256, 200, args.seed + i) for i, p in enumerate(["The ", "A "])],
        }
        if previous is not None:
            # Continued training: keep the history, add this stage's figures to it.
            info["continued_from"] = previous
            info["tokens_seen"] += previous.get("tokens_seen", 0)
            info["training_minutes"] = round(info["training_minutes"] + previous.get("training_minutes", 0), 1)
        print(json.dumps(info, indent=2), flush=True)
        save(target, target_cfg, args.out, "tiny-fortunes", info, prompts, logit_texts)
        ddir = os.path.join(args.out, "tiny-fortunes-draft")
        if args.only == "target" and os.path.exists(os.path.join(ddir, "model.safetensors")):
            # The draft's agreement with the target changes with the target: measure it again.
            draft = Llama(draft_cfg)
            from_safetensors(draft, os.path.join(ddir, "model.safetensors"))
            with open(os.path.join(ddir, "training.json")) as f:
                dinfo = json.load(f)
            dinfo["greedy_agreement_with_target"] = round(greedy_agreement(draft.eval(), target.eval(), val_eval, 256), 3)
            with open(os.path.join(ddir, "training.json"), "w") as f:
                json.dump(dinfo, f, indent=2)
                f.write("\n")
            print(f"draft agreement with the new target: {dinfo['greedy_agreement_with_target']}", flush=True)
    else:
        from_safetensors(target, os.path.join(tdir, "model.safetensors"))

    if args.only in ("draft", "both"):
        torch.manual_seed(args.seed + 1)
        draft = Llama(draft_cfg)
        secs = train(draft, stream, args.draft_steps, args.batch, args.seq, 3e-3, args.seed + 1, 50, "draft")
        bpb = evaluate_bits_per_byte(draft, val_eval, 256)
        agree = greedy_agreement(draft.eval(), target.eval(), val_eval, 256)
        info = {
            "parameters": sum(p.numel() for p in draft.parameters()),
            "steps": args.draft_steps, "batch": args.batch, "seq": args.seq, "seed": args.seed + 1,
            "training_minutes": round(secs / 60, 1), "threads": args.threads,
            "heldout_bits_per_byte": round(bpb, 3),
            "greedy_agreement_with_target": round(agree, 3),
            "torch": torch.__version__,
        }
        print(json.dumps(info, indent=2), flush=True)
        save(draft, draft_cfg, args.out, "tiny-fortunes-draft", info, prompts, logit_texts)


def from_safetensors(model, path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    state = model.hf_state()
    for name, t in state.items():
        a, b = header[name]["data_offsets"]
        vals = torch.frombuffer(bytearray(data[a:b]), dtype=torch.float32).view(*header[name]["shape"])
        with torch.no_grad():
            t.copy_(vals)


if __name__ == "__main__":
    main()
