/// @file observed_store.hpp
/// @brief A float KV cache that reports every append: the seam through which the tests watch how
/// a forward uses its caches (lesson 02 counts how often each position's K/V is computed; lesson
/// 03 checks that a batch runs one layer at a time over all its sequences).
#pragma once

#include <functional>
#include <utility>

#include "lessons/02_kv_cache/kv_cache.hpp"

namespace infer::testing {

/// A KVCache that calls an observer before each append.
class ObservedStore final : public KVStore {
 public:
  /// Told the layer, the first position written and how many rows, before each append.
  using Observer = std::function<void(int layer, int first, int rows)>;

  ObservedStore(const ModelConfig& c, int max_tokens, Observer observe)
      : inner_(c, max_tokens), observe_(std::move(observe)) {}
  int num_layers() const override { return inner_.num_layers(); }
  int length(int layer) const override { return inner_.length(layer); }
  int max_tokens() const override { return inner_.max_tokens(); }
  void append(int layer, ConstMatrixRef k, ConstMatrixRef v) override {
    observe_(layer, inner_.length(layer), static_cast<int>(k.rows()));
    inner_.append(layer, k, v);
  }
  /// The cache's own truncate (KVStore's generic one would append the kept rows again, and
  /// report them).
  void truncate(int length) override { inner_.truncate(length); }
  ConstMatrixRef keys(int layer) const override { return inner_.keys(layer); }
  ConstMatrixRef values(int layer) const override { return inner_.values(layer); }
  void reset() override { inner_.reset(); }
  size_t bytes_used() const override { return inner_.bytes_used(); }
  size_t bytes_reserved() const override { return inner_.bytes_reserved(); }

 private:
  KVCache inner_;
  Observer observe_;
};

}  // namespace infer::testing
