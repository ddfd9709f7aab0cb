// Lesson 01: the plumbing given to students, compiled with your exercises/ and with the reference.
#include "lessons/01_roofline/roofline.hpp"

#include <omp.h>

#include <vector>

#include "common/options.hpp"
#include "common/tensor.hpp"

namespace infer {

ModelShape shape_from_config(const ModelConfig& c, const std::string& name) {
  ModelShape s{name,          c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
               c.head_dim,    c.intermediate_size, c.vocab_size,  c.tie_word_embeddings, 0,
               false};
  s.parameters = dense_parameter_count(s);
  return s;
}

double measure_read_bandwidth(size_t bytes) {
  const size_t n = bytes / sizeof(float);
  std::vector<float> data(n);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<float>(i & 1023);  // first touch by the reading thread
  volatile float sink = 0;
  const double s = best_seconds(5, [&] {
    float total = 0;
    // Each thread sums its own contiguous chunk with Eigen's vectorized sum: a plain `total +=
    // data[i]` loop is one dependent add after another and measures add latency, not memory.
#pragma omp parallel reduction(+ : total)
    {
      const size_t threads = static_cast<size_t>(omp_get_num_threads()), t = static_cast<size_t>(omp_get_thread_num());
      const size_t begin = n * t / threads, end = n * (t + 1) / threads;
      total += Eigen::Map<const Eigen::VectorXf>(data.data() + begin, static_cast<Eigen::Index>(end - begin)).sum();
    }
    sink = sink + total;
  });
  return static_cast<double>(n * sizeof(float)) / s;
}

double measure_matmul_flops(int n) {
  Matrix a = Matrix::Random(n, n), b = Matrix::Random(n, n), c(n, n);
  c.noalias() = a * b;  // warm up
  const double s = best_seconds(5, [&] { c.noalias() = a * b; });
  return 2.0 * n * n * n / s;
}

}  // namespace infer
