// make_model: a model of any shape with seeded random weights, written as config.json and
// model.safetensors (float32), so that the engine's large-model figures can be reproduced without
// downloading anything (`./course make-model DIR ...`).
//
//   make_model --out DIR [--hidden 768] [--layers 12] [--heads 12] [--kv-heads 4] [--mlp 2048]
//              [--vocab 259] [--context 1024] [--seed 1]
//
// The defaults make the 75.9M-parameter shape (304 MB of float32) the engine bench calls "large":
// far bigger than any cache, so a decode step streams its weights from memory. Random weights
// generate nonsense text, at exactly the speed a trained model of the shape would.
#include <cstdio>
#include <filesystem>

#include "common/options.hpp"
#include "common/weights.hpp"

using namespace infer;

int main(int argc, char** argv) {
  try {
    const Options opts(argc, argv, "make_model",
                       {"--out", "--hidden", "--layers", "--heads", "--kv-heads", "--mlp", "--vocab", "--context", "--seed"},
                       {"-h", "--help"});
    if (opts.help()) {
      std::printf("usage: make_model --out DIR [--hidden 768] [--layers 12] [--heads 12] [--kv-heads 4] [--mlp 2048]\n"
                  "                  [--vocab 259] [--context 1024] [--seed 1]\n"
                  "  writes a model of that shape with seeded random weights (float32) to DIR, as config.json\n"
                  "  and model.safetensors. The defaults make the 75.9M-parameter shape the benches call large.\n"
                  "  The course's programs read text with a vocabulary of 259 (bytes and three special\n"
                  "  tokens); a larger --vocab makes a model only the benches can run.\n");
      return 0;
    }
    require(opts.has("--out"), "make_model: --out DIR is required (where config.json and model.safetensors go)");
    ModelConfig c;
    c.hidden_size = static_cast<int>(opts.number("--hidden", 768, 1));
    c.num_hidden_layers = static_cast<int>(opts.number("--layers", 12, 1));
    c.num_attention_heads = static_cast<int>(opts.number("--heads", 12, 1));
    c.num_key_value_heads = static_cast<int>(opts.number("--kv-heads", 4, 1));
    c.intermediate_size = static_cast<int>(opts.number("--mlp", 2048, 1));
    c.vocab_size = static_cast<int>(opts.number("--vocab", 259, 4));
    c.max_position_embeddings = static_cast<int>(opts.number("--context", 1024, 1));
    require(c.hidden_size % c.num_attention_heads == 0, "make_model: --hidden ", c.hidden_size,
            " must be a multiple of --heads ", c.num_attention_heads);
    c.head_dim = c.hidden_size / c.num_attention_heads;
    c.validate("make_model");
    const ModelWeights m = random_model(c, static_cast<uint64_t>(opts.number("--seed", 1, 0)));
    const std::string dir = opts.text("--out", "");
    require(!std::filesystem::exists(std::filesystem::path(dir) / "model.safetensors") &&
                !std::filesystem::exists(std::filesystem::path(dir) / "config.json"),
            "make_model: '", dir, "' already holds a model: give a new directory (remove that one first to replace it)");
    save_model(m, dir);
    std::printf("wrote %s: %ld parameters, %.1f MB of float32\n", dir.c_str(), m.parameter_count(),
                4e-6 * static_cast<double>(m.parameter_count()));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
