// common/: file formats, the tokenizer, the generator, and the validation given to students.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <omp.h>

#include "common/linear.hpp"
#include "common/options.hpp"
#include "common/rng.hpp"
#include "common/safetensors.hpp"
#include "common/testing/throws.hpp"
#include "common/tokenizer.hpp"
#include "common/weights.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/03_batching/engine.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"
#include "lessons/06_speculative_decoding/speculative.hpp"
#include "lessons/10_serving/serving.hpp"
#include "common/testing/compare.hpp"
#include "common/testing/models.hpp"
#include "common/testing/runners.hpp"
#include "tests/02_kv_cache/observed_store.hpp"
#include "tools/engine_parts.hpp"

namespace infer {
namespace {

namespace fs = std::filesystem;
using testing::throws_error_mentioning;

/// A scratch directory removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("infer_test_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string safetensors_bytes(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header + data;
}

TEST(Compare, AllCloseSaysHowManyDifferencesAreNaNApartFromTheLargest) {
  Eigen::VectorXf want(4), got(4);
  want << 1, 2, 3, 4;
  got << 1, std::nanf(""), 3.5f, std::nanf("");
  const std::string message = testing::all_close(want, got, 1e-5, 1e-4, "v").message();
  EXPECT_NE(message.find("3 of 4 values differ"), std::string::npos) << message;
  EXPECT_NE(message.find("largest difference 0.5, 2 of them NaN"), std::string::npos) << message;
  got << 1, std::nanf(""), 3, 4;
  const std::string only_nan = testing::all_close(want, got, 1e-5, 1e-4, "v").message();
  EXPECT_NE(only_nan.find("(1 of them NaN)"), std::string::npos) << only_nan;
  EXPECT_EQ(only_nan.find("largest difference"), std::string::npos) << only_nan;
}

TEST(Safetensors, ReadsF32F16AndBf16) {
  TempDir dir;
  float f[2] = {1.5f, -2.25f};
  const unsigned char half[4] = {0x00, 0x3C, 0x00, 0xC0};   // 1.0, -2.0 in binary16
  const unsigned char bf16[4] = {0x80, 0x3F, 0x40, 0x40};   // 1.0, 3.0 in bfloat16
  std::string data(reinterpret_cast<const char*>(f), 8);
  data += std::string(reinterpret_cast<const char*>(half), 4) + std::string(reinterpret_cast<const char*>(bf16), 4);
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F16","shape":[1,2],"data_offsets":[8,12]},)"
      R"("c":{"dtype":"BF16","shape":[2],"data_offsets":[12,16]},"__metadata__":{"format":"pt"}})";
  write_file(dir.path / "t.safetensors", safetensors_bytes(header, data));
  const auto t = read_safetensors((dir.path / "t.safetensors").string());
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t.at("a").data, (std::vector<float>{1.5f, -2.25f}));
  EXPECT_EQ(t.at("b").shape, (std::vector<long>{1, 2}));
  EXPECT_EQ(t.at("b").data, (std::vector<float>{1.0f, -2.0f}));
  EXPECT_EQ(t.at("c").data, (std::vector<float>{1.0f, 3.0f}));
}

TEST(Safetensors, HalfPrecisionEdgeCases) {
  EXPECT_EQ(half_to_float(0x7BFF), 65504.0f);           // largest finite
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(half_to_float(0x7C00)));
  EXPECT_TRUE(std::signbit(half_to_float(0x8000)));
}

TEST(Safetensors, TruncatedFileSaysSo) {
  TempDir dir;
  const std::string header = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  write_file(dir.path / "t.safetensors", safetensors_bytes(header, std::string(8, '\0')));
  EXPECT_TRUE(throws_error_mentioning([&] { read_safetensors((dir.path / "t.safetensors").string()); }, "truncated"));
  write_file(dir.path / "short.safetensors", "abc");
  EXPECT_TRUE(throws_error_mentioning([&] { read_safetensors((dir.path / "short.safetensors").string()); },
                                      "at least 8"));
}

TEST(Safetensors, ShapeAndByteRangeMustAgree) {
  TempDir dir;
  const std::string header = R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})";
  write_file(dir.path / "t.safetensors", safetensors_bytes(header, std::string(16, '\0')));
  EXPECT_TRUE(throws_error_mentioning([&] { read_safetensors((dir.path / "t.safetensors").string()); },
                                      "expected 12"));
}

TEST(Safetensors, EveryMalformedFileIsRefusedWithItsReason) {
  // Each case: a header, the data section after it, and the words the refusal must contain.
  struct Case {
    const char* what;
    std::string header, data, says;
  };
  const std::string f32x4(16, '\0');
  std::string nan_bytes(4, '\0'), inf_bf16(2, '\0');
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan_bytes.data(), &nan, 4);
  inf_bf16[1] = static_cast<char>(0x7F), inf_bf16[0] = static_cast<char>(0x80);  // +inf in bfloat16
  const std::vector<Case> cases = {
      {"two tensors on the same bytes", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", f32x4, "overlaps tensor"},
      {"ranges that overlap in part", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", std::string(24, '\0'), "overlaps tensor"},
      {"a gap before a tensor", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[4,20]}})", std::string(20, '\0'), "4 bytes before tensor 'a' belong to no tensor"},
      {"bytes after the last tensor", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", std::string(20, '\0'), "4 bytes after the last tensor"},
      {"an element count past 64 bits", R"({"a":{"dtype":"F32","shape":[4611686018427387905],"data_offsets":[0,16]}})", f32x4, "more elements than 64 bits"},
      {"a product past 64 bits", R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", f32x4, "more elements than 64 bits"},
      {"a negative dimension", R"({"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", f32x4, "non-negative integers"},
      {"a shape that is not an array", R"({"a":{"dtype":"F32","shape":"4","data_offsets":[0,16]}})", f32x4, "shape must be an array"},
      {"a numeric dtype", R"({"a":{"dtype":5,"shape":[4],"data_offsets":[0,16]}})", f32x4, "dtype must be a string"},
      {"an unsupported dtype", R"({"a":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", f32x4, "dtype I64 is not supported"},
      {"one data offset", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0]}})", f32x4, "data_offsets must be two"},
      {"a NaN weight", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", nan_bytes, "element 0 is nan"},
      {"an infinite bfloat16 weight", R"({"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}})", inf_bf16, "weights must be finite"},
  };
  TempDir dir;
  for (const Case& c : cases) {
    write_file(dir.path / "t.safetensors", safetensors_bytes(c.header, c.data));
    EXPECT_TRUE(throws_error_mentioning([&] { read_safetensors((dir.path / "t.safetensors").string()); }, c.says))
        << c.what;
  }
  // Each refusal names the file and, where there is one, the tensor.
  write_file(dir.path / "t.safetensors", safetensors_bytes(cases[8].header, cases[8].data));
  EXPECT_TRUE(throws_error_mentioning([&] { read_safetensors((dir.path / "t.safetensors").string()); },
                                      "t.safetensors', tensor 'a'"));
  // A header length above the format's 100 MB limit is refused before anything is read.
  std::string huge(8, '\0');
  huge[3] = static_cast<char>(0x80);  // 2^31
  write_file(dir.path / "huge.safetensors", huge + "{}");
  EXPECT_TRUE(throws_error_mentioning([&] { read_safetensors((dir.path / "huge.safetensors").string()); },
                                      "above the format's limit"));
  fs::create_directories(dir.path / "adir");
  EXPECT_TRUE(throws_error_mentioning([&] { read_safetensors((dir.path / "adir").string()); }, "is a directory"));
  EXPECT_TRUE(throws_error_mentioning([&] { read_safetensors((dir.path / "none").string()); }, "no such file"));
}

TEST(Config, EveryBadValueIsRefusedByName) {
  // The bundled config.json with one key changed, and the words the refusal must contain.
  std::ifstream in(bundled_model_dir("tiny-fortunes") + "/config.json");
  const nlohmann::json base = nlohmann::json::parse(in);
  struct Case {
    const char* key;
    nlohmann::json value;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"hidden_size", 4294967488ULL, "key 'hidden_size' must be an integer in [1, 2147483647], got 4294967488"},
      {"num_hidden_layers", 4294967300ULL, "key 'num_hidden_layers' must be an integer"},
      {"hidden_size", 192.7, "got 192.7"},
      {"num_hidden_layers", true, "got true"},
      {"vocab_size", 1e10, "key 'vocab_size' must be an integer"},
      {"vocab_size", -3, "got -3"},
      {"bos_token_id", "1", "key 'bos_token_id' must be an integer"},
      {"rms_norm_eps", 1e300, "key 'rms_norm_eps' must be a finite number that fits a float"},
      {"rope_theta", "big", "key 'rope_theta' must be a finite number"},
      {"hidden_act", "gelu", "key 'hidden_act' is \"gelu\"; this engine implements only \"silu\""},
      {"model_type", "mistral", "implements only \"llama\""},
      {"rope_scaling", nlohmann::json{{"type", "linear"}, {"factor", 2.0}}, "plain RoPE only"},
      {"attention_bias", true, "no bias"},
      {"tie_word_embeddings", "yes", "must be true or false"},
      {"max_position_embeddings", 1000000000, "above 1048576"},
      {"intermediate_size", 2000000000, "parameters"},
  };
  TempDir dir;
  for (const Case& c : cases) {
    nlohmann::json j = base;
    j[c.key] = c.value;
    write_file(dir.path / "config.json", j.dump());
    EXPECT_TRUE(throws_error_mentioning([&] { load_config((dir.path / "config.json").string()); }, c.says))
        << c.key << " = " << c.value.dump();
  }
  fs::create_directories(dir.path / "cfgdir");
  EXPECT_TRUE(throws_error_mentioning([&] { load_config((dir.path / "cfgdir").string()); }, "is a directory"));
  // A vocabulary larger than the byte tokenizer's is refused when the model is loaded.
  nlohmann::json j = base;
  j["vocab_size"] = 300;
  write_file(dir.path / "config.json", j.dump());
  fs::copy_file(bundled_model_dir("tiny-fortunes") + "/model.safetensors", dir.path / "model.safetensors");
  EXPECT_TRUE(throws_error_mentioning([&] { load_model(dir.path.string()); },
                                      "vocab_size 300 is larger than the byte tokenizer's 259 ids"));
}

/// A seeded mutation of `seed`: a few bytes flipped, deleted, duplicated, or replaced by a
/// number or token that parsers get wrong.
std::string mutate(const std::string& seed, Rng& rng) {
  static const std::vector<std::string> tokens = {"4294967296", "-1", "1e300", "18446744073709551615", "[]", "{}",
                                                  "null", "true", "0", "9223372036854775807", "\"F32\"", "nan", ",", "\""};
  std::string s = seed;
  const int edits = 1 + static_cast<int>(rng.below(4));
  for (int e = 0; e < edits && !s.empty(); ++e) {
    const size_t at = rng.below(s.size());
    switch (rng.below(4)) {
      case 0: s[at] = static_cast<char>(rng.below(256)); break;
      case 1: s.erase(at, 1 + rng.below(4)); break;
      case 2: s.insert(at, s.substr(at, 1 + rng.below(8))); break;
      default: s.insert(at, tokens[rng.below(tokens.size())]); break;
    }
  }
  return s;
}

/// Runs `load` on `bytes` written to `file`: it may succeed or throw infer::Error, nothing else.
template <class Load>
::testing::AssertionResult only_errors(const fs::path& file, const std::string& bytes, Load load) {
  write_file(file, bytes);
  try {
    load(file.string());
  } catch (const Error&) {
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "not an infer::Error (" << e.what() << ") for input of " << bytes.size()
                                         << " bytes: " << ::testing::PrintToString(bytes.substr(0, 200));
  }
  return ::testing::AssertionSuccess();
}

TEST(Loader, MutatedFilesOnlyEverGiveInferErrors) {
  // A seeded mutation fuzzer, bounded by a count (the sanitizer build runs it too, where it also
  // catches undefined behaviour): 3,000 mutations of a small safetensors file (its length prefix
  // kept right half the time, so that the header's JSON is reached) and 3,000 of config.json.
  TempDir dir;
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},"c":{"dtype":"F16","shape":[1],"data_offsets":[22,24]}})";
  std::string data(24, '\0');
  data[3] = 0x3F;  // a few ordinary values
  const std::string seed = safetensors_bytes(header, data);
  std::ifstream in(bundled_model_dir("tiny-fortunes") + "/config.json");
  const std::string config((std::istreambuf_iterator<char>(in)), {});
  Rng rng(2026);
  int failures = 0;
  for (int i = 0; i < 3000 && failures < 5; ++i) {
    std::string bytes;
    if (rng.below(2) == 0) {
      std::string body = mutate(header, rng) + data;
      bytes = safetensors_bytes(body.substr(0, body.size() - data.size()), data);  // a consistent length prefix
    } else {
      bytes = mutate(seed, rng);
    }
    const auto r = only_errors(dir.path / "f.safetensors", bytes, [](const std::string& p) { read_safetensors(p); });
    EXPECT_TRUE(r) << "mutation " << i;
    failures += !r;
  }
  for (int i = 0; i < 3000 && failures < 5; ++i) {
    const auto r = only_errors(dir.path / "config.json", mutate(config, rng), [](const std::string& p) { load_config(p); });
    EXPECT_TRUE(r) << "config mutation " << i;
    failures += !r;
  }
}

TEST(Weights, BundledModelsLoadWithTheDocumentedShape) {
  const ModelWeights t = load_model(bundled_model_dir("tiny-fortunes"));
  EXPECT_EQ(t.config.hidden_size, 192);
  EXPECT_EQ(t.config.num_hidden_layers, 4);
  EXPECT_EQ(t.config.num_attention_heads, 8);
  EXPECT_EQ(t.config.num_key_value_heads, 2);
  EXPECT_EQ(t.config.vocab_size, ByteTokenizer::kVocabSize);
  EXPECT_EQ(t.parameter_count(), 1649472);
  const ModelWeights d = load_model(bundled_model_dir("tiny-fortunes-draft"));
  EXPECT_EQ(d.config.hidden_size, 96);
  EXPECT_EQ(d.config.vocab_size, t.config.vocab_size) << "draft and target must share a vocabulary";
}

TEST(Weights, WrongShapeNamesTensorAndBothShapes) {
  TempDir dir;
  fs::copy_file(bundled_model_dir("tiny-fortunes") + "/model.safetensors", dir.path / "model.safetensors");
  // Same weights, but a config claiming a wider MLP: the first MLP tensor must be refused.
  std::ifstream in(bundled_model_dir("tiny-fortunes") + "/config.json");
  std::string config((std::istreambuf_iterator<char>(in)), {});
  const auto at = config.find("\"intermediate_size\": 512");
  ASSERT_NE(at, std::string::npos);
  config.replace(at, std::strlen("\"intermediate_size\": 512"), "\"intermediate_size\": 640");
  write_file(dir.path / "config.json", config);
  EXPECT_TRUE(throws_error_mentioning([&] { load_model(dir.path.string()); },
                                      "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [512, 192], "
                                      "expected [640, 192]"));
}

TEST(Weights, MissingConfigKeyIsNamed) {
  TempDir dir;
  write_file(dir.path / "config.json", R"({"hidden_size": 8})");
  EXPECT_TRUE(throws_error_mentioning([&] { load_config((dir.path / "config.json").string()); }, "vocab_size"));
  EXPECT_TRUE(throws_error_mentioning([&] { load_model((dir.path / "nope").string()); }, "not a directory"));
}

TEST(Linear, EqualsThePlainProductOnOddShapes) {
  // linear() against x * W^T: the register-tiled path (up to kLinearTileRows rows of x: every
  // remainder of its 4 x 4 tiles; one row of x with whole packets goes through its own loop, 16
  // and 48 columns) on 1 and 3 threads, the matrix-product path above it; output and input sizes
  // that are not multiples of a vector's width, of a tile or of the thread count.
  // Tolerance 1e-5 sqrt(cols) + 1e-5 |y| (sums in another order).
  const int threads_before = omp_get_max_threads();
  for (int threads : {1, 3}) {
    omp_set_num_threads(threads);
    for (int n : {1, 2, 3, 4, 5, 7, 8, 9, 33, kLinearTileRows, kLinearTileRows + 1}) {
      for (int out : {1, 3, 17, 130, 1000}) {
        for (int in : {1, 7, 16, 33, 48, 1023}) {
          Rng rng(static_cast<uint64_t>(n * 1000003 + out * 1009 + in));
          Matrix x(n, in), w(out, in);
          for (float& v : x.reshaped()) v = static_cast<float>(rng.normal());
          for (float& v : w.reshaped()) v = static_cast<float>(rng.normal());
          const Matrix want = x * w.transpose(), got = linear(x, w);
          ASSERT_EQ(got.rows(), n);
          ASSERT_EQ(got.cols(), out);
          const double atol = 1e-5 * std::sqrt(static_cast<double>(in));
          for (long i = 0; i < want.size(); ++i)
            ASSERT_LE(std::abs(want.data()[i] - got.data()[i]), atol + 1e-5 * std::abs(want.data()[i]))
                << n << " x " << in << " times [" << out << ", " << in << "]^T on " << threads << " threads, entry " << i;
        }
      }
    }
  }
  omp_set_num_threads(threads_before);
  Matrix x(2, 5), w(3, 4), y(2, 3);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { linear(x, w); }, "columns"));
  Matrix w5(3, 5), y_bad(3, 3);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { linear_into(x, w5, y_bad); }, "expected 2 x 3"));
}

TEST(Linear, RowsOfWOnOneThreadEqualTheWholeProduct) {
  // linear_rows_into() over each thread's share_of() the rows of W, put together, against
  // linear() (bit for bit up to kLinearTileRows rows of x: the same tiles, the same sums) and
  // against x * W^T above it (Eigen's product over a slice: 1e-5 sqrt(cols) + 1e-5 |y|); with
  // accumulate, added to what y held. Shares cover [0, n) in order, cut at multiples of the grain.
  for (int parts : {1, 2, 3, 7})
    for (long n : {0L, 1L, 5L, 17L, 130L}) {
      long next = 0;
      for (int p = 0; p < parts; ++p) {
        const Share s = share_of(n, p, parts);
        EXPECT_EQ(s.begin, next) << "part " << p << " of " << parts << " of " << n;
        EXPECT_TRUE(s.begin % 4 == 0 || s.begin == n);
        next = s.end;
      }
      EXPECT_EQ(next, n);
    }
  for (int n : {1, 3, 4, 9, kLinearTileRows + 3})
    for (int out : {5, 130})
      for (int in : {7, 33, 48}) {
        Rng rng(static_cast<uint64_t>(n * 7919 + out * 31 + in));
        Matrix x(n, in), w(out, in), y0(n, out);
        for (float& v : x.reshaped()) v = static_cast<float>(rng.normal());
        for (float& v : w.reshaped()) v = static_cast<float>(rng.normal());
        for (float& v : y0.reshaped()) v = static_cast<float>(rng.normal());
        Matrix y = y0, z(n, out);
        for (int p = 0; p < 3; ++p) {
          const Share s = share_of(out, p, 3);
          linear_rows_into(x, w, y, s.begin, s.size(), true);
          linear_rows_into(x, w, z, s.begin, s.size(), false);
        }
        const Matrix want = x * w.transpose();
        const double atol = 1e-5 * std::sqrt(static_cast<double>(in));
        if (n <= kLinearTileRows) {
          EXPECT_EQ(z, linear(x, w)) << n << " rows";
        }
        for (long i = 0; i < want.size(); ++i) {
          ASSERT_LE(std::abs(want.data()[i] - z.data()[i]), atol + 1e-5 * std::abs(want.data()[i])) << n << " rows";
          const float sum = want.data()[i] + y0.data()[i];
          ASSERT_LE(std::abs(sum - y.data()[i]), atol + 1e-5 * std::abs(sum)) << n << " rows, accumulated";
        }
      }
  Matrix x(2, 5), w(3, 5), y(2, 3);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { linear_rows_into(x, w, y, 2, 2, false); }, "rows [2, 4)"));
}

TEST(Weights, SavedRandomModelsLoadBackExactly) {
  // save_model (./course make-model) writes what load_model reads, bit for bit, tied or not.
  for (bool tied : {false, true}) {
    ModelConfig c;
    c.vocab_size = 40, c.hidden_size = 24, c.intermediate_size = 40, c.num_hidden_layers = 2;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 6, c.max_position_embeddings = 64;
    c.tie_word_embeddings = tied;
    const ModelWeights m = random_model(c, 5);
    TempDir dir;
    save_model(m, (dir.path / "model").string());
    const ModelWeights back = load_model((dir.path / "model").string());
    EXPECT_EQ(back.config.hidden_size, 24);
    EXPECT_EQ(back.config.tie_word_embeddings, tied);
    EXPECT_EQ(back.embed_tokens, m.embed_tokens);
    EXPECT_EQ(back.lm_head, m.lm_head);
    EXPECT_EQ(back.norm, m.norm);
    for (int l = 0; l < 2; ++l) {
      EXPECT_EQ(back.layers[l].q_proj, m.layers[l].q_proj);
      EXPECT_EQ(back.layers[l].down_proj, m.layers[l].down_proj);
      EXPECT_EQ(back.layers[l].post_attention_layernorm, m.layers[l].post_attention_layernorm);
    }
  }
}

TEST(Tokenizer, RoundTripsUtf8AndSkipsSpecials) {
  const std::string text = "Fortune: ça va? \xF0\x9F\x8E\xB2";
  const auto ids = ByteTokenizer::encode(text);
  EXPECT_EQ(ids.front(), ByteTokenizer::kBos);
  EXPECT_EQ(ids[1], 'F' + 3);
  EXPECT_EQ(ByteTokenizer::decode(ids), text);
  EXPECT_EQ(ByteTokenizer::decode(std::vector<int>{1, 'h' + 3, 'i' + 3, 2}), "hi");
  EXPECT_TRUE(throws_error_mentioning([] { ByteTokenizer::decode(std::vector<int>{5, 259}); }, "index 1"));
}

TEST(Rng, IsReproducibleAndUniformish) {
  Rng a(7), b(7), c(8);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.next_u64(), b.next_u64());
  EXPECT_NE(Rng(7).next_u64(), c.next_u64());
  Rng r(1);
  double sum = 0;
  for (int i = 0; i < 100000; ++i) sum += r.uniform();
  EXPECT_NEAR(sum / 100000, 0.5, 0.01);
  // The first value of seed 0 is fixed by the algorithm, on every platform.
  EXPECT_EQ(Rng(0).next_u64(), 0xE220A8397B1DCDAFull);
}

/// Options from a list of words, the program's name first.
Options parse(std::vector<std::string> words) {
  words.insert(words.begin(), "prog");
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  return Options(static_cast<int>(argv.size()), argv.data(), "prog", {"--n", "--x", "--prompt"}, {"--flag"},
                 {{"--max-num-seqs", "--n"}, {"--enable-flag", "--flag"}});
}

TEST(Options, IntegersAreRangeCheckedNeverWrapped) {
  EXPECT_EQ(parse({"--n", "42"}).number("--n", 0), 42);
  EXPECT_EQ(parse({}).number("--n", 7), 7) << "the fallback when absent";
  // As an int, 4294967300 would wrap to 4 and 2147483648 to -2147483648: refused by name instead.
  EXPECT_TRUE(throws_error_mentioning([] { parse({"--n", "4294967300"}).number("--n", 0); }, "--n expects an integer"));
  EXPECT_TRUE(throws_error_mentioning([] { parse({"--n", "2147483648"}).number("--n", 0); }, "2147483647"));
  EXPECT_TRUE(throws_error_mentioning([] { parse({"--n", "99999999999999999999"}).number("--n", 0); }, "--n"));
  EXPECT_TRUE(throws_error_mentioning([] { parse({"--n", "0"}).number("--n", 5, 1); }, "[1, "));
  EXPECT_TRUE(throws_error_mentioning([] { parse({"--n", "12abc"}).number("--n", 0); }, "'12abc'"));
  EXPECT_EQ(parse({"--n", "4294967300"}).number("--n", 0, 0, std::numeric_limits<long>::max()), 4294967300L)
      << "a seed may use the whole range when the caller says so";
}

TEST(Options, RealsMustBeFinite) {
  EXPECT_DOUBLE_EQ(parse({"--x", "0.5"}).real("--x", 1), 0.5);
  for (const char* bad : {"inf", "-inf", "nan", "1e999", "", "0.5x"})
    EXPECT_TRUE(throws_error_mentioning([&] { parse({"--x", bad}).real("--x", 1); }, "finite number")) << bad;
  EXPECT_DOUBLE_EQ(parse({"--x", "0.01"}).real("--x", 1, 0.01, 86400), 0.01);
  for (const char* outside : {"0.001", "1e10", "-1"})
    EXPECT_TRUE(throws_error_mentioning([&] { parse({"--x", outside}).real("--x", 1, 0.01, 86400); }, "[0.01, 86400]"))
        << outside;
}

TEST(Options, AnOptionIsNotTheValueOfTheOneBefore) {
  EXPECT_TRUE(throws_error_mentioning([] { parse({"--prompt", "--n", "8"}); },
                                      "--prompt needs a value, but the next argument is the option '--n'"));
  EXPECT_TRUE(throws_error_mentioning([] { parse({"--n"}); }, "--n needs a value"));
  EXPECT_TRUE(throws_error_mentioning([] { parse({"--bogus"}); }, "unknown option '--bogus'"));
  EXPECT_EQ(parse({"--prompt", "-- a dash"}).text("--prompt", ""), "-- a dash") << "any other text is a value";
}

TEST(Options, AnAliasReadsAsTheOptionItNames) {
  EXPECT_EQ(parse({"--max-num-seqs", "8"}).number("--n", 0), 8);
  EXPECT_TRUE(parse({"--enable-flag"}).has("--flag"));
  EXPECT_TRUE(throws_error_mentioning([] { parse({"--n", "4", "--max-num-seqs", "8"}); },
                                      "--max-num-seqs and --n are the same option"));
  EXPECT_TRUE(throws_error_mentioning([] { parse({"--prompt", "--max-num-seqs", "8"}); }, "--prompt needs a value"));
  EXPECT_TRUE(throws_error_mentioning([] { parse({"--n", "4", "--n", "8"}); }, "--n is given twice"));
  EXPECT_TRUE(throws_error_mentioning([] { parse({"--flag", "--flag"}); }, "--flag is given twice"));
}

TEST(Plumbing, SamplingParamsRejectNonsense) {
  EXPECT_TRUE(throws_error_mentioning([] { SamplingParams{.top_p = 0.0f}.validate(); }, "top_p"));
  EXPECT_TRUE(throws_error_mentioning([] { SamplingParams{.top_p = 1.5f}.validate(); }, "(0, 1]"));
  EXPECT_TRUE(throws_error_mentioning([] { SamplingParams{.temperature = -1.0f}.validate(); }, "temperature"));
  EXPECT_TRUE(throws_error_mentioning([] { SamplingParams{.top_k = -3}.validate(); }, "top_k"));
}

TEST(Plumbing, CheckTokensNamesTheProblem) {
  ModelConfig c;
  c.vocab_size = 10, c.max_position_embeddings = 4;
  EXPECT_TRUE(throws_error_mentioning([&] { check_tokens(c, std::vector<int>{}, "f"); }, "empty"));
  EXPECT_TRUE(throws_error_mentioning([&] { check_tokens(c, std::vector<int>{1, 2, 3, 4, 5}, "f"); }, "context"));
  EXPECT_TRUE(throws_error_mentioning([&] { check_tokens(c, std::vector<int>{1, -1}, "f"); }, "index 1"));
}

TEST(Plumbing, EngineSubmitRefusesBadRequests) {
  ModelConfig cfg;
  cfg.vocab_size = 40, cfg.hidden_size = 16, cfg.intermediate_size = 16, cfg.num_hidden_layers = 1;
  cfg.num_attention_heads = 2, cfg.num_key_value_heads = 1, cfg.head_dim = 8, cfg.max_position_embeddings = 64;
  const ModelWeights m = random_model(cfg, 1);
  Engine engine(m, Policy::Continuous, 2);
  engine.submit({1, {1, 5}, 4, {}, 0});
  EXPECT_TRUE(testing::throws_error_mentioning([&] { engine.submit({1, {1, 6}, 4, {}, 0}); }, "already submitted"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { engine.submit({2, {1, 6}, 70, {}, 0}); }, "context"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { engine.submit({3, {1, 6}, 0, {}, 0}); }, "new tokens"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { engine.submit({4, {}, 3, {}, 0}); }, "empty"));
}

/// A planner that returns a fixed mistake, to see the engine refuse it.
class BadPlanner final : public Planner {
 public:
  explicit BadPlanner(int kind) : kind_(kind) {}
  std::vector<Planned> plan(Engine& e) override {
    Sequence* s = e.admit_next();
    if (s == nullptr) return {};
    if (kind_ == 0) return {{s, 1}, {s, 1}};          // a sequence twice
    if (kind_ == 1) return {{s, s->uncomputed() + 1}};  // more than it has to feed
    return {{s, 0}};                                   // nothing
  }

 private:
  int kind_;
};

TEST(Plumbing, TheEngineRefusesABadPlanNamingTheRequest) {
  const ModelWeights& m = testing::small_model();
  for (int kind = 0; kind < 3; ++kind) {
    Engine engine(std::make_unique<CpuRunner>(m), std::make_unique<SlotKVManager>(m.config, 2), {.max_running = 2},
                  std::make_unique<BadPlanner>(kind));
    engine.submit({42, {1, 5, 6}, 3, {}, 0});
    EXPECT_TRUE(testing::throws_error_mentioning([&] { engine.step(); }, "request 42")) << "mistake " << kind;
  }
}

TEST(Plumbing, TenThousandRequestsLeaveNothingBehind) {
  // A long-running server's engine: requests come and go, a few are cancelled, and the engine
  // holds only what runs and waits. Container by container, nothing grows with the requests served.
  const ModelWeights& m = testing::small_model();
  Engine engine(std::make_unique<CpuRunner>(m), std::make_unique<SlotKVManager>(m.config, 4),
                {.max_running = 4, .keep_log = false});
  size_t left = 0, most_held = 0;
  long tokens = 0;
  for (int id = 0; id < 10000; ++id) {
    engine.submit({id % 50, {1, 3 + id % 30}, 1 + id % 3, {.temperature = 0.0f}, engine.now()});
    if (id % 97 == 0) engine.cancel(id % 50);
    while (engine.footprint().requests >= 8) {
      for (const TokenEvent& e : engine.step()) tokens += e.token >= 0;
      left += engine.take_finished().size();
    }
    const EngineFootprint f = engine.footprint();
    most_held = std::max(most_held, f.requests + f.finished + f.queued + f.log);
  }
  while (!engine.idle()) engine.step();
  left += engine.take_finished().size();
  EXPECT_EQ(left, 10000u) << "every request leaves exactly once (finished or cancelled)";
  EXPECT_GT(tokens, 0);
  const EngineFootprint f = engine.footprint();
  EXPECT_EQ(f.requests, 0u);
  EXPECT_EQ(f.running, 0u);
  EXPECT_EQ(f.waiting, 0u);
  EXPECT_EQ(f.finished, 0u);
  EXPECT_LE(f.log, 1u) << "without keep_log the engine keeps the last step's log only";
  EXPECT_LE(f.queued, 1u) << "a cancelled request's queue entry lingers only until it reaches the head";
  EXPECT_LE(most_held, 30u) << "what the engine held at any time, over 10,000 requests";
  EXPECT_FALSE(engine.cancel(1)) << "a request that left is unknown to the engine";
}

/// A block pool whose rows are not where paged_attention() can read them (as a GPU's are not):
/// they live in its own arrays, reached only through write, read and copy_block, and attend()
/// reads them back first. What lesson 08's CudaPagedKVPool is to the bookkeeping, on a CPU.
class FarPool final : public KVBlockPool {
 public:
  FarPool(const ModelConfig& c, int num_blocks, int block_size)
      : KVBlockPool(c, num_blocks, block_size),
        k_(c.num_hidden_layers, Matrix::Zero(static_cast<Eigen::Index>(num_blocks) * block_size, kv_dim())),
        v_(k_) {}
  void write(int layer, std::span<const int> slots, ConstMatrixRef k, ConstMatrixRef v) override {
    check_rows("FarPool::write", layer, slots, k.rows(), v.rows(), k.cols(), v.cols());
    for (size_t i = 0; i < slots.size(); ++i) {
      k_[layer].row(slots[i]) = k.row(static_cast<Eigen::Index>(i));
      v_[layer].row(slots[i]) = v.row(static_cast<Eigen::Index>(i));
    }
    ++writes;
  }
  void read(int layer, std::span<const int> slots, bool keys, Matrix& out) const override {
    out.resize(static_cast<Eigen::Index>(slots.size()), kv_dim());
    for (size_t i = 0; i < slots.size(); ++i) out.row(static_cast<Eigen::Index>(i)) = (keys ? k_ : v_)[layer].row(slots[i]);
  }
  void copy_block(int src, int dst) override {
    for (int l = 0; l < num_layers(); ++l) {
      k_[l].middleRows(static_cast<Eigen::Index>(dst) * block_size(), block_size()) =
          k_[l].middleRows(static_cast<Eigen::Index>(src) * block_size(), block_size());
      v_[l].middleRows(static_cast<Eigen::Index>(dst) * block_size(), block_size()) =
          v_[l].middleRows(static_cast<Eigen::Index>(src) * block_size(), block_size());
    }
  }
  Matrix attend(int layer, ConstMatrixRef q, std::span<const int> table, int length, int heads, int kv_heads,
                int head_dim) const override {
    std::vector<int> slots(static_cast<size_t>(length));
    for (int p = 0; p < length; ++p) slots[p] = table[p / block_size()] * block_size() + p % block_size();
    Matrix k, v;
    read(layer, slots, true, k);
    read(layer, slots, false, v);
    return causal_attention(q, k, v, heads, kv_heads, head_dim);
  }
  mutable long writes = 0;

 private:
  std::vector<Matrix> k_, v_;
};

TEST(Plumbing, TheBookkeepingRunsOverAPoolWhoseRowsLieElsewhere) {
  // Lesson 04's tables and preemption and lesson 05's prefix cache over a pool that is not
  // PagedKVPool: the seam lesson 08's GPU pool uses. Greedy tokens equal lesson 03's slots.
  const ModelWeights& m = testing::bundled_model();
  std::vector<GenerationRequest> rs;
  const char* prompts[] = {"Q: What is the sea? A:", "Q: What is the sea? A: It", "Fortune", "Q: What is a", "Never",
                           "Q: What is the sea? A: The"};
  for (int i = 0; i < 6; ++i) rs.push_back({i, ByteTokenizer::encode(prompts[i]), 20 + 4 * i, {.temperature = 0.0f}, i});
  Engine plain(m, Policy::Continuous, 3);
  for (const auto& r : rs) plain.submit(r);
  const auto want = plain.run();
  for (int kind = 0; kind < 2; ++kind) {
    SCOPED_TRACE(kind == 0 ? "PagedKVManager, a pool small enough to preempt" : "PrefixKVManager");
    auto pool = std::make_unique<FarPool>(m.config, kind == 0 ? 12 : 40, 8);
    FarPool& far = *pool;
    std::unique_ptr<KVManager> memory;
    if (kind == 0) memory = std::make_unique<PagedKVManager>(std::move(pool));
    else memory = std::make_unique<PrefixKVManager>(std::move(pool));
    Engine engine(std::make_unique<CpuRunner>(m), std::move(memory), {.max_running = 3});
    for (const auto& r : rs) engine.submit(r);
    const auto got = engine.run();
    ASSERT_EQ(got.size(), want.size());
    int preempted = 0, cached = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
      preempted += got[i].preemptions;
      cached += got[i].cached_tokens;
    }
    EXPECT_GT(far.writes, 0) << "the rows went through the pool's write()";
    if (kind == 0) {
      EXPECT_GT(preempted, 0) << "the pool was meant to be small enough to preempt";
      EXPECT_EQ(engine.memory().reserved_tokens(), 0) << "every block back in the pool";
    } else {
      EXPECT_GT(cached, 0) << "the shared question was meant to be found in the cache";
    }
  }
}

TEST(Plumbing, SpeculationOverPagedAndPrefixMemoryGivesPlainGreedyTokens) {
  // Speculative decodes reserve their guesses' positions only from what is free, and roll back
  // through the block tables (PagedKVCache::truncate): in a pool small enough to preempt, and over
  // a prefix cache whose shared blocks a rollback must not touch, greedy tokens stay plain
  // decoding's and every block comes back.
  const ModelWeights& m = testing::bundled_model();
  const std::string system = "Q: What does a wise person say about ";
  std::vector<GenerationRequest> rs;
  const char* topics[] = {"the sea? A:", "money? A:", "love? A:", "work? A:", "cats? A:", "time? A:", "rain? A:"};
  for (int i = 0; i < 7; ++i)
    rs.push_back({i, ByteTokenizer::encode(system + topics[i]), 24 + 5 * i, {.temperature = 0.0f}, i / 2});
  Engine plain(m, Policy::Continuous, 4);
  for (const auto& r : rs) plain.submit(r);
  const auto want = plain.run();
  for (int kind = 0; kind < 2; ++kind) {
    SCOPED_TRACE(kind == 0 ? "a small paged pool" : "a prefix cache");
    std::unique_ptr<KVManager> memory;
    if (kind == 0) memory = std::make_unique<PagedKVManager>(m.config, 24, 8);
    else memory = std::make_unique<PrefixKVManager>(m.config, 48, 8);
    const KVManager* mem = memory.get();
    Engine engine(std::make_unique<CpuRunner>(m), std::move(memory), {.max_running = 4, .speculative_tokens = 5},
                  nullptr, prompt_lookup_speculator());
    for (const auto& r : rs) engine.submit(r);
    const auto got = engine.run();
    ASSERT_EQ(got.size(), want.size());
    int preempted = 0, cached = 0;
    long accepted = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
      preempted += got[i].preemptions;
      cached += got[i].cached_tokens;
    }
    for (const EngineStepLog& e : engine.log()) accepted += e.accepted;
    EXPECT_GT(accepted, 0) << "no guess was kept";
    if (kind == 0) {
      EXPECT_GT(preempted, 0) << "the pool was meant to be small enough to preempt";
      EXPECT_EQ(mem->reserved_tokens(), 0) << "every block back in the pool";
    } else {
      EXPECT_GT(cached, 0) << "the shared question was meant to be found in the cache";
    }
  }
}

TEST(Plumbing, TheStepLogCountsWhatTheForwardComputes) {
  // Lesson 05's and 10's tests count computed positions from the step log, lesson 05's graded
  // ones at the forward: the two must agree, step by step, with prompts planned in chunks, a
  // prefix cache's hits left out, preemptions recomputed and speculative guesses fed.
  const ModelWeights& m = testing::bundled_model();
  const std::string system = "You are a fortune teller. Answer every question with one short fortune. ";
  std::vector<GenerationRequest> rs;
  for (int i = 0; i < 6; ++i)
    rs.push_back({i, ByteTokenizer::encode(system + "Q: number " + std::to_string(i) + "? A:"), 20 + 4 * i,
                  {.temperature = i % 2 ? 0.8f : 0.0f, .seed = 7u + i}, i < 4 ? 0 : 80});
  for (int speculate = 0; speculate < 2; ++speculate) {
    SCOPED_TRACE(speculate ? "with prompt lookup" : "without speculation");
    std::vector<long> per_call;  // positions each forward computes
    const auto count = [&](const StepInput& step) {
      long n = 0;
      for (const Chunk& c : step.chunks) n += static_cast<long>(c.tokens.size());
      per_call.push_back(n);
    };
    Engine engine(std::make_unique<testing::WatchedForward>(m, count),
                  std::make_unique<PrefixKVManager>(m.config, 24, 8),
                  {.max_running = 4, .speculative_tokens = speculate ? 4 : 0}, std::make_unique<ChunkedPrefill>(24),
                  speculate ? prompt_lookup_speculator() : nullptr);
    for (const auto& r : rs) engine.submit(r);
    const auto results = engine.run();
    int cached = 0, preempted = 0;
    for (const auto& r : results) cached += r.cached_tokens, preempted += r.preemptions;
    EXPECT_GT(cached, 0) << "the shared system prompt was meant to hit";
    EXPECT_GT(preempted, 0) << "the pool was meant to be small enough to preempt";
    size_t call = 0;
    for (const EngineStepLog& e : engine.log()) {
      ASSERT_LE(e.forwards, 1) << "step " << e.step;
      if (e.forwards == 0) continue;
      ASSERT_LT(call, per_call.size()) << "step " << e.step << " logged a forward the runner never saw";
      EXPECT_EQ(e.prefill_tokens + e.decodes + e.proposed, per_call[call++]) << "step " << e.step;
    }
    EXPECT_EQ(call, per_call.size()) << "every forward call is logged";
  }
}

TEST(EngineParts, EachChoiceGivesItsMemoryAndTheSameTokens) {
  // tools/engine_parts.hpp, as the programs call it on the CPU: slots, a pool, a prefix cache,
  // with or without a speculator, all give plain greedy decoding's tokens; nonsense is refused.
  const ModelWeights& m = testing::bundled_model();
  const GenerationRequest r{0, ByteTokenizer::encode("The secret of"), 20, {.temperature = 0.0f}, 0};
  Engine plain(m, Policy::Continuous, 1);
  plain.submit(r);
  const std::vector<int> want = plain.run()[0].tokens;
  struct Case {
    EngineChoice choice;
    std::string speculative;
  };
  const std::vector<Case> cases = {{{.slots = 2}, ""},
                                   {{.paged = true, .num_blocks = 8, .block_size = 8}, "ngram"},
                                   {{.paged = true, .prefix_cache = true, .num_blocks = 8, .block_size = 8}, "draft"}};
  const ModelWeights& draft = testing::bundled_draft();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.choice.prefix_cache ? "prefix cache" : c.choice.paged ? "paged" : "slots");
    EngineParts parts = engine_parts(m, c.choice, ModelProjections{}, nullptr, GpuWeights{});
    engine_speculator(parts, c.speculative, &draft, m.config, "cpu", GpuWeights{});
    ASSERT_NE(parts.runner, nullptr);
    EXPECT_EQ(parts.speculator != nullptr, !c.speculative.empty());
    EXPECT_EQ(dynamic_cast<SlotKVManager*>(parts.memory.get()) != nullptr, !c.choice.paged);
    EXPECT_EQ(dynamic_cast<PagedKVManager*>(parts.memory.get()) != nullptr, c.choice.paged && !c.choice.prefix_cache);
    EXPECT_EQ(parts.prefix, c.choice.prefix_cache ? dynamic_cast<PrefixKVManager*>(parts.memory.get()) : nullptr);
    const int guesses = parts.speculator ? 3 : 0;  // (before the speculator moves)
    Engine engine(std::move(parts.runner), std::move(parts.memory), {.max_running = 1, .speculative_tokens = guesses},
                  nullptr, std::move(parts.speculator));
    engine.submit(r);
    EXPECT_EQ(engine.run()[0].tokens, want);
  }
  EXPECT_TRUE(throws_error_mentioning(
      [&] { engine_parts(m, {.prefix_cache = true}, ModelProjections{}, nullptr, GpuWeights{}); }, "needs a paged pool"));
  EXPECT_TRUE(throws_error_mentioning(
      [&] { engine_parts(m, {.device = "tpu"}, ModelProjections{}, nullptr, GpuWeights{}); }, "device 'tpu'"));
  EngineParts parts;
  EXPECT_TRUE(throws_error_mentioning(
      [&] { engine_speculator(parts, "draft", nullptr, m.config, "cpu", GpuWeights{}); }, "draft with its model"));
}

TEST(Plumbing, TheEventsOfAStepAreTheTokensItsRequestsGet) {
  // What a server streams (each step's TokenEvents) must add up to each request's result, with
  // the finish reason on its last event, under preemption (a tight pool) and chunked prompts.
  const ModelWeights& m = testing::small_model();
  const auto engine = serving_engine(std::make_unique<CpuRunner>(m), std::make_unique<PagedKVManager>(m.config, 7, 4),
                                     {.max_running = 3, .token_budget = 5});
  for (int i = 0; i < 12; ++i)
    engine->submit({i, {1, 3 + i, 4 + i, 5, 6, 7, 8}, 2 + i % 5, {.temperature = 0.9f, .seed = 5u + i}, i / 4});
  std::map<int, std::vector<int>> streamed;
  std::map<int, FinishReason> last;
  std::vector<GenerationResult> results;
  while (!engine->idle()) {
    for (const TokenEvent& e : engine->step()) {
      ASSERT_EQ(last.count(e.id), 0u) << "request " << e.id << " got a token after its last";
      streamed[e.id].push_back(e.token);
      if (e.finish != FinishReason::None) last[e.id] = e.finish;
    }
    for (GenerationResult& r : engine->take_finished()) results.push_back(std::move(r));
  }
  ASSERT_EQ(results.size(), 12u);
  int preemptions = 0;
  for (const GenerationResult& r : results) preemptions += r.preemptions;
  EXPECT_GT(preemptions, 0) << "the pool was meant to be tight enough to preempt";
  for (const GenerationResult& r : results) {
    EXPECT_EQ(streamed[r.id], r.tokens) << "request " << r.id;
    ASSERT_EQ(last.count(r.id), 1u) << "request " << r.id << "'s last event says why it ended";
    EXPECT_EQ(last[r.id], r.finish) << "request " << r.id;
  }
}

TEST(ForwardStep, EqualsEachSequenceAlone) {
  // The engine's varlen forward (lesson 03, given) against lesson 02's forward_cached, one sequence at a time:
  // chunks of 1 to 9 tokens on caches already holding 0 to 6 positions, in one call, and again
  // with a second step on the same caches. Tolerance 1e-4 + 1e-4 |ref| (rows summed in another
  // order by the stacked products).
  const ModelWeights& m = testing::small_model();
  const std::vector<std::vector<int>> past = {{}, {1, 5}, {1, 9, 10, 11, 12, 13}, {1}};
  const std::vector<std::vector<int>> steps[2] = {{{1, 4, 4, 4, 4, 4, 4, 4, 5}, {20}, {21, 22, 23}, {7, 8}},
                                                  {{6}, {24, 25}, {26}, {9, 10, 11, 12, 13, 14, 15}}};
  std::vector<std::unique_ptr<KVCache>> chunked, alone;
  for (const auto& p : past) {
    chunked.push_back(std::make_unique<KVCache>(m.config, 32));
    alone.push_back(std::make_unique<KVCache>(m.config, 32));
    if (!p.empty()) {
      forward_cached(m, p, *chunked.back());
      forward_cached(m, p, *alone.back());
    }
  }
  // The first step on 1 thread, the second on 3: the step's one parallel region splits every
  // product by rows of W and attention by chunks, over however many threads it gets.
  const int threads_before = omp_get_max_threads();
  int threads = 1;
  for (const auto& step : steps) {
    StepInput input;
    for (size_t i = 0; i < step.size(); ++i) input.chunks.push_back({step[i], chunked[i].get()});
    omp_set_num_threads(threads);
    const Matrix logits = forward_step(m, input);
    omp_set_num_threads(threads_before);
    threads = 3;
    ASSERT_EQ(logits.rows(), static_cast<Eigen::Index>(step.size()));
    for (size_t i = 0; i < step.size(); ++i) {
      const Matrix want = forward_cached(m, step[i], *alone[i]);
      EXPECT_TRUE(testing::all_close(want.row(want.rows() - 1), logits.row(static_cast<Eigen::Index>(i)), 1e-4, 1e-4,
                                     cat("chunk ", i, " of ", step[i].size(), " tokens")));
      EXPECT_EQ(chunked[i]->length(), alone[i]->length());
    }
  }
  StepInput bad{{{steps[0][1], chunked[0].get()}, {steps[0][2], chunked[0].get()}}};
  EXPECT_TRUE(testing::throws_error_mentioning([&] { forward_step(m, bad); }, "shares its cache"));
  bad.chunks = {{std::span<const int>(), chunked[0].get()}};
  EXPECT_TRUE(testing::throws_error_mentioning([&] { forward_step(m, bad); }, "empty"));
  const std::vector<int> too_long(40, 3);
  bad.chunks = {{too_long, chunked[1].get()}};
  EXPECT_TRUE(testing::throws_error_mentioning([&] { forward_step(m, bad); }, "exceed"));
  EXPECT_TRUE(testing::throws_error_mentioning([&] { forward_step(m, StepInput{}); }, "no chunks"));
}

TEST(ForwardStep, OnAnyThreadCountPagedAndInt8StoresAndAFailureInsideTheStep) {
  // One decode step of three sequences, on a paged cache, an INT8 cache and a float cache, on 1, 2
  // and 3 threads: the same logits bit for bit (each entry of every product is one thread's whole
  // sum, whichever thread), and each equals forward_cached() of its sequence alone (1e-4 + 1e-4 |ref|).
  // A store that throws at its second append (layer 1) ends the step with that error, on every
  // thread count, instead of hanging the other threads at the next meeting.
  const ModelWeights& m = testing::small_model();
  const int threads_before = omp_get_max_threads();
  const std::vector<int> past = {1, 5, 9, 12}, next = {7};
  std::vector<Matrix> results;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    PagedKVPool pool(m.config, 8, 4);
    PagedKVCache paged(pool, 16);
    Int8KVCache int8(m.config, 16);
    KVCache plain(m.config, 16);
    for (KVStore* s : std::vector<KVStore*>{&paged, &int8, &plain}) forward_step(m, {{{past, s}}});
    results.push_back(forward_step(m, {{{next, &paged}, {next, &int8}, {next, &plain}}}));
    int appends = 0;
    testing::ObservedStore failing(m.config, 16, [&](int, int, int) {
      require(++appends != 2, "append ", appends, " fails, as the test asked");
    });
    EXPECT_TRUE(testing::throws_error_mentioning([&] { forward_step(m, {{{next, &plain}, {next, &failing}}}); },
                                                 "append 2 fails"))
        << threads << " threads";
  }
  omp_set_num_threads(threads_before);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
  std::vector<int> all = past;
  all.push_back(next[0]);
  KVCache alone(m.config, 16);
  Int8KVCache alone_int8(m.config, 16);
  const Matrix want = forward_cached(m, all, alone), want_int8 = forward_cached(m, all, alone_int8);
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(testing::all_close((i == 1 ? want_int8 : want).bottomRows(1), results[0].row(i), 1e-4, 1e-4,
                                   cat("sequence ", i)));
}

TEST(ForwardStep, ATreeChunkBesideOthersGivesEachPathsLogits) {
  // A chunk with a mask (lesson 06's tree of guesses) in the same step as a decode and a chain:
  // row i of the tree's logits equals forward_cached() of the path from the root to node i alone,
  // after the same past; a lower-triangular mask is the plain causal chunk. Tolerance as above.
  const ModelWeights& m = testing::small_model();
  const std::vector<int> past = {1, 5, 9}, tree = {6, 20, 21, 22, 23}, parent = {-1, 0, 0, 1, 2};
  TreeMask mask = TreeMask::Zero(5, 5);
  for (int i = 0; i < 5; ++i)
    for (int j = i; j >= 0; j = parent[j]) mask(i, j) = true;  // itself and its ancestors
  KVCache tree_cache(m.config, 32), decode_cache(m.config, 32), chain_cache(m.config, 32);
  forward_cached(m, past, tree_cache);
  forward_cached(m, past, decode_cache);
  const std::vector<int> decode = {7}, chain = {1, 2, 3};
  StepInput input{{{decode, &decode_cache}, {tree, &tree_cache, -1, 5, &mask}, {chain, &chain_cache}}};
  const Matrix logits = forward_step(m, input);
  ASSERT_EQ(logits.rows(), 7);
  EXPECT_EQ(tree_cache.length(), 8) << "every node's K/V is appended, in node order";
  for (int i = 0; i < 5; ++i) {
    std::vector<int> path;
    for (int j = i; j >= 0; j = parent[j]) path.insert(path.begin(), tree[j]);
    KVCache alone(m.config, 32);
    forward_cached(m, past, alone);
    const Matrix want = forward_cached(m, path, alone);
    EXPECT_TRUE(testing::all_close(want.row(want.rows() - 1), logits.row(1 + i), 1e-4, 1e-4, cat("tree node ", i)));
  }
  // The causal chunk as a mask: the same logits as without one.
  KVCache masked(m.config, 32), plain(m.config, 32);
  TreeMask causal = TreeMask::Zero(3, 3);
  for (int i = 0; i < 3; ++i) causal.row(i).head(i + 1).setConstant(true);
  const Matrix a = forward_step(m, {{{chain, &masked, -1, 3, &causal}}});
  const Matrix b = forward_step(m, {{{chain, &plain, -1, 3}}});
  EXPECT_TRUE(testing::all_close(b, a, 1e-4, 1e-4, "a lower-triangular mask"));
  // Masks the forward refuses, before anything is appended.
  KVCache fresh(m.config, 32);
  TreeMask wrong = causal;
  wrong(1, 1) = false;
  EXPECT_TRUE(testing::throws_error_mentioning([&] { forward_step(m, {{{chain, &fresh, -1, 1, &wrong}}}); }, "from itself"));
  wrong = causal;
  wrong(0, 2) = true;
  EXPECT_TRUE(testing::throws_error_mentioning([&] { forward_step(m, {{{chain, &fresh, -1, 1, &wrong}}}); }, "later token"));
  const TreeMask small = TreeMask::Ones(2, 2);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { forward_step(m, {{{chain, &fresh, -1, 1, &small}}}); }, "mask is [2, 2]"));
  EXPECT_EQ(fresh.length(), 0);
}

}  // namespace
}  // namespace infer
