// Lesson 09: the plumbing given to students (no CUDA needed).
#include "common/errors.hpp"
#include "lessons/09_flash_attention/prefill_kernels.hpp"

namespace infer::gpu {

void check_prefill_shape(int T, int S, int heads, int kv_heads, int head_dim, const char* who) {
  require(T >= 1 && S >= T, who, ": T ", T, " and S ", S, " (expected 1 <= T <= S: the queries are the last T of S positions)");
  require(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0, who, ": heads ", heads, " and kv_heads ", kv_heads,
          " (expected both >= 1, heads a multiple of kv_heads)");
  require(head_dim >= 1 && head_dim <= 256, who, ": head_dim must be in [1, 256], got ", head_dim);
}

size_t prefill_workspace_floats(int version, int T, int S, int heads) {
  require(version >= 1 && version <= prefill_attention_versions(), "prefill_workspace_floats: version ", version,
          " does not exist (1 to ", prefill_attention_versions(), ")");
  require(T >= 1 && S >= 1 && heads >= 1, "prefill_workspace_floats: T ", T, ", S ", S, ", heads ", heads,
          " (each must be >= 1)");
  return version == 1 ? static_cast<size_t>(heads) * T * S : 0;
}

}  // namespace infer::gpu
