#include "common/testing/golden.hpp"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/errors.hpp"
#include "common/weights.hpp"

namespace infer::testing {

Golden load_golden(const std::string& model) {
  const std::string path = (std::filesystem::path(bundled_model_dir(model)) / "golden.json").string();
  std::ifstream in(path);
  require(in.good(), "golden fixtures: cannot open '", path, "'");
  try {
    const auto j = nlohmann::json::parse(in);
    Golden g;
    for (const auto& e : j.at("logits")) {
      GoldenLogits l;
      l.text = e.at("text").get<std::string>();
      l.ids = e.at("ids").get<std::vector<int>>();
      l.positions = e.at("positions").get<std::vector<int>>();
      l.logits = e.at("logits").get<std::vector<std::vector<float>>>();
      g.logits.push_back(std::move(l));
    }
    for (const auto& e : j.at("greedy")) {
      GoldenGreedy r;
      r.prompt = e.at("prompt").get<std::string>();
      r.prompt_ids = e.at("prompt_ids").get<std::vector<int>>();
      r.max_new_tokens = e.at("max_new_tokens").get<int>();
      r.ids = e.at("ids").get<std::vector<int>>();
      r.min_top2_gap = e.at("min_top2_gap").get<double>();
      g.greedy.push_back(std::move(r));
    }
    return g;
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("golden fixtures '", path, "': ", e.what()));
  }
}

}  // namespace infer::testing
