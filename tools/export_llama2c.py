#!/usr/bin/env python3
"""Write a model directory (config.json + float32 model.safetensors) as a llama2.c checkpoint.

    tools/export_llama2c.py MODEL_DIR OUT.bin

Writes OUT.bin (llama2.c's original layout: a header of 7 int32, then the weights, grouped-query
attention allowed) and OUT.bin.tokenizer (one single-byte string per id, enough for an ASCII
prompt), so that llama2.c's run.c can decode the same weights for a speed comparison with
`./course generate --kv-cache --stats`:

    ./course make-model --out /tmp/m75
    tools/export_llama2c.py /tmp/m75 /tmp/m75.bin
    ./run /tmp/m75.bin -z /tmp/m75.bin.tokenizer -t 0 -n 200 -i "Once"

The texts differ (run.c rotates adjacent pairs for RoPE, Hugging Face's layout rotates halves),
the work per token does not. Standard library only.
"""
import json
import struct
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dst = sys.argv[1], sys.argv[2]
    with open(f"{src}/config.json") as f:
        cfg = json.load(f)
    dim, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim", dim // heads)
    if head_dim * heads != dim:
        sys.exit(f"llama2.c needs hidden_size = heads x head_dim; got {dim} and {heads} x {head_dim}")
    layers, vocab, tied = cfg["num_hidden_layers"], cfg["vocab_size"], cfg.get("tie_word_embeddings", False)
    with open(f"{src}/model.safetensors", "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n

        def tensor(name):
            info = header.get(name)
            if info is None or info["dtype"] != "F32":
                sys.exit(f"{src}: tensor {name} missing or not float32")
            begin, end = info["data_offsets"]
            f.seek(base + begin)
            return f.read(end - begin)

        with open(dst, "wb") as out:
            # A negative vocab_size tells run.c that lm_head is stored apart from the embedding.
            out.write(struct.pack("<7i", dim, cfg["intermediate_size"], layers, heads, cfg["num_key_value_heads"],
                                  vocab if tied else -vocab, cfg["max_position_embeddings"]))
            out.write(tensor("model.embed_tokens.weight"))
            for key in ["input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                        "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.down_proj",
                        "mlp.up_proj"]:  # run.c's w1, w2, w3 are gate, down, up
                for layer in range(layers):
                    out.write(tensor(f"model.layers.{layer}.{key}.weight"))
            out.write(tensor("model.norm.weight"))
            # Two RoPE tables of [context, head_dim / 2] that run.c skips: zeros.
            out.write(bytes(4 * cfg["max_position_embeddings"] * head_dim))
            if not tied:
                out.write(tensor("lm_head.weight"))
    with open(f"{dst}.tokenizer", "wb") as t:
        t.write(struct.pack("<i", 1))
        for i in range(vocab):
            piece = bytes([i - 3]) if 3 <= i < 259 else b"?"
            t.write(struct.pack("<fi", 0.0, len(piece)) + piece)
    print(f"wrote {dst} and {dst}.tokenizer")


if __name__ == "__main__":
    main()
