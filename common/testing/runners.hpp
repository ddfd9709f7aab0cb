/// @file runners.hpp
/// @brief Model runners for tests: one that reports each forward the engine asks of it, one that
/// takes its time and never ends a text early (for tests where a request must still be running
/// when a client leaves).
#pragma once

#include <chrono>
#include <functional>
#include <thread>

#include "lessons/03_batching/engine.hpp"

namespace infer::testing {

/// CpuRunner over `m`, calling `watch(step)` before each forward: what a test counts or records of
/// the steps the engine runs (positions, the thread that runs them, ...).
class WatchedForward final : public ModelRunner {
 public:
  /// Runs `m`, which must outlive it, and `watch`, called on the thread that runs the forward.
  WatchedForward(const ModelWeights& m, std::function<void(const StepInput&)> watch)
      : inner_(m), watch_(std::move(watch)) {}
  const ModelConfig& config() const override { return inner_.config(); }
  Matrix forward(const StepInput& step) override {
    watch_(step);
    return inner_.forward(step);
  }

 private:
  CpuRunner inner_;
  std::function<void(const StepInput&)> watch_;
};

/// CpuRunner over `m`, 5 ms slower per step, with EOS never chosen (so a request runs to its
/// max_tokens).
class SlowForward final : public ModelRunner {
 public:
  /// Runs `m`, which must outlive it.
  explicit SlowForward(const ModelWeights& m) : inner_(m) {}
  const ModelConfig& config() const override { return inner_.config(); }
  Matrix forward(const StepInput& step) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    Matrix logits = inner_.forward(step);
    logits.col(config().eos_token_id).setConstant(-1e9f);
    return logits;
  }

 private:
  CpuRunner inner_;
};

}  // namespace infer::testing
