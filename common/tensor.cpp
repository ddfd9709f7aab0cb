#include "common/tensor.hpp"

namespace infer {

std::string shape_string(const std::vector<long>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace infer
