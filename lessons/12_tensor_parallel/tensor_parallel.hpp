/// @file tensor_parallel.hpp
/// @brief Lesson 12's contract: one model split over N ranks (Megatron-style tensor parallelism),
/// the ranks talking through a Communicator, rank 0's engine driving them all.
///
/// A rank holds a slice of every layer: whole query heads and the K/V heads they read, a slice of
/// the MLP's units. Q, K, V, gate and up are split by their rows (output features: the heads and
/// units a rank computes), O and down by their columns (input features: the same heads and units,
/// now read), so a layer needs the other ranks twice: after O and after down, where each rank
/// holds a partial sum of the whole residual update, one all-reduce adds them up. The embedding,
/// the norms and the output head are the same on every rank (replicated).
///
/// Yours, in exercises/12_tensor_parallel/tensor_parallel.cpp:
/// - shard_plan(): which heads, K/V heads and units a rank holds, and the shapes it refuses;
/// - load_shard(): a rank's slice of every matrix, reading only its own bytes;
/// - RowParallelProjection::rows_into(): a product by a column slice of W, and the all-reduce
///   that completes it;
/// - tensor_parallel(): which of a rank's products are row-parallel.
///
/// Given (lessons/12_tensor_parallel/given.cpp): the communicators (threads in
/// one process, for tests and the grader; MPI processes for real runs), the weight sources (a
/// safetensors file read in parts, or a model in memory), rank_config(), and
/// TensorParallelRunner, the engine's forward seam over the group.
#pragma once

#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "common/model_config.hpp"
#include "common/projection.hpp"
#include "common/tensor.hpp"
#include "common/weights.hpp"
#include "lessons/03_batching/engine.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"

namespace infer {

// =========================================================== the communicator (given) ==

/// What one rank's communicator counted: the collectives it took part in.
struct CommStats {
  long all_reduces = 0;       ///< all_reduce() calls
  long floats_reduced = 0;    ///< floats this rank handed to them
  long broadcasts = 0;        ///< broadcast() calls
  double seconds = 0;         ///< time spent inside the collectives (waiting for the others included)
};

/// The seam between the ranks of a tensor-parallel group: each rank holds one Communicator and
/// calls the same collectives in the same order as every other rank (a collective returns only
/// once every rank has called it). thread_group()'s run in one process (threads); mpi_world()'s are processes
/// (`mpirun -n N`), on one machine or several. A GPU engine would put NCCL's ncclAllReduce behind
/// the same calls, on device buffers and a stream (the lesson's text says what changes).
class Communicator {
 public:
  virtual ~Communicator() = default;
  /// This rank: 0 .. size() - 1. Rank 0 runs the engine; the others follow it.
  virtual int rank() const = 0;
  /// Ranks in the group.
  virtual int size() const = 0;

  /// data[0, n) becomes the sum over the ranks of their data[0, n), the same floats on every rank
  /// (thread_group()'s ranks add them in rank order; MPI's promises the same floats on every rank,
  /// in an order of its own). Every rank passes the same n.
  void all_reduce(float* data, long n);
  /// `bytes` of rank `root` handed to every rank (the others' `bytes` are replaced).
  void broadcast(std::vector<char>& bytes, int root);
  /// What this rank has counted so far.
  const CommStats& stats() const { return stats_; }
  /// Sets the counts back to zero.
  void reset_stats() { stats_ = {}; }

 protected:
  /// all_reduce() itself, without the counting.
  virtual void all_reduce_sum(float* data, long n) = 0;
  /// broadcast() itself, without the counting.
  virtual void broadcast_bytes(std::vector<char>& bytes, int root) = 0;

 private:
  CommStats stats_;
};

/// `size` communicators of one group in this process, rank i at index i: each to be used by one
/// thread (rank i's), the threads running concurrently. Throws infer::Error for size < 1.
std::vector<std::unique_ptr<Communicator>> thread_group(int size);

/// Runs work(comm) on `size` threads, one per rank of a thread_group(), and waits for them all.
/// Each rank's OpenMP regions (forward_step()'s) run on its one thread.
/// If a rank throws, the group is broken (the others would wait forever at their next
/// collective): every rank's collectives then throw too, and the first error is rethrown here.
void run_ranks(int size, const std::function<void(Communicator&)>& work);

/// Whether this build has MPI (COURSE_HAVE_MPI).
bool have_mpi();

/// The MPI communicator of this process (MPI_COMM_WORLD, MPI initialized at the first call and
/// finalized at exit). Throws infer::Error where the build has no MPI.
Communicator& mpi_world();

/// For a program asked to run on `ranks` ranks: if this process was not started by mpirun, starts
/// `mpirun -n ranks` on this same program with the same arguments (with `--oversubscribe`, so that
/// the ranks may outnumber the cores, and `--allow-run-as-root` as root), and returns its exit
/// status. Rank 0 prints straight to this process's stdout and stderr (handed to it over a socket
/// named in its environment, so that text and statistics arrive in the order it printed them;
/// through mpirun the two streams travel apart); the other ranks' output comes through mpirun.
/// Returns -1 when this process is already one of the ranks (then mpi_world().size() must be
/// `ranks`: checked). While mpirun runs, this process's first SIGINT (Ctrl-C), SIGTERM or SIGHUP
/// (one it ignored when called stays ignored), or a write to its output after the reader left
/// (`| head`), reaches every rank as SIGUSR1 (sent with sigqueue(), carrying 1; a second stop's
/// carries 2, which a rank that sigwait()s can read); a second one (5 ms or more later: `timeout`
/// signals twice at once) then aborts the job, as does a stop that finds rank 0 waiting a second on an output
/// nobody reads; if this process dies otherwise, mpirun ends the job. On a
/// rank (the call that returns -1), SIGUSR1 from then on sets stop_requested() instead of ending
/// the process, and so do SIGINT, SIGTERM and SIGHUP that reach the rank itself (a service manager
/// that signals every process of the job at once: mpirun then ends the ranks a second later): a program stops cleanly by reading it between steps (or by sigwait()ing for
/// SIGUSR1, blocked, as the server does), rank 0 letting the followers return, and exits 0 (a rank
/// that died of a signal or exited non-zero would have mpirun print a box about it). The launching
/// process then sees stop_requested() too and says how a stop ends: end_as_stopped() for a command
/// (generate), the status for a server told to stop (0). Throws infer::Error where the build has
/// no MPI or mpirun cannot be found.
int launch_ranks(int ranks, int argc, char** argv, const std::string& program);

/// Whether a stop arrived: on a rank that launch_ranks() returned -1 to, the SIGUSR1 by which it
/// passes one on; in the process that called launch_ranks() to start mpirun, after it returned,
/// the stop it passed on. False elsewhere.
bool stop_requested();

/// The exit status a program returns at the end of a run that finished, failed (serve-offline
/// that refused a prompt) or not: on rank 0 under launch_ranks(), 0, with what it printed flushed
/// and `status` left for the launching process to exit with (a rank's non-zero exit would have
/// mpirun say it aborted the job, the other ranks having ended cleanly; and where a stop reached
/// mpirun too, mpirun ends the job failed, whatever rank 0 did); elsewhere `status`. Not for
/// errors that end a rank early: there mpirun's ending of the job is what keeps the others from
/// waiting for it.
int rank_result(int status);

/// In the process that called launch_ranks() to start mpirun, after a stop it passed on: ends this
/// process by the stop's signal (SIGINT for Ctrl-C, SIGPIPE for a reader gone), as the signal would
/// have ended a program run without ranks, so that a shell script running it stops too (an exit
/// status of 130 would let it go on). Returns, doing nothing, where no stop was passed on.
void end_as_stopped();

/// The model a program's process runs on (given): load_model(dir) without a group (`comm` null);
/// with one, this rank's shard of it, read by load_shard() (only its own bytes of the file).
ModelWeights load_model_for(const std::string& dir, Communicator* comm);

// ================================================================= the shard (yours) ==

/// A contiguous range [begin, end) of heads or units.
struct Range {
  long begin = 0;  ///< first
  long end = 0;    ///< one past the last
  /// How many.
  long size() const { return end - begin; }
  /// Same range.
  bool operator==(const Range&) const = default;
};

/// Prints [begin, end) (as the tests' failures show a Range).
inline std::ostream& operator<<(std::ostream& os, const Range& r) { return os << "[" << r.begin << ", " << r.end << ")"; }

/// What rank `rank` of `world` holds of each layer.
struct ShardPlan {
  int rank = 0;      ///< this rank
  int world = 1;     ///< ranks in the group
  Range heads;       ///< its query heads: rows [begin, end) * head_dim of q_proj, the same columns of o_proj
  Range kv_heads;    ///< the K/V heads those query heads read: rows [begin, end) * head_dim of k_proj and v_proj
  Range units;       ///< its MLP units: rows of gate_proj and up_proj, columns of down_proj
};

/// Rank `rank`'s share of a model shaped `config`, over `world` ranks: query heads and MLP units
/// split into `world` equal contiguous ranges, rank r holding the r-th; K/V heads those its query
/// heads read under grouped-query attention (query head h reads K/V head h / config.group_size()).
/// When there are at least as many K/V heads as ranks, each rank holds num_key_value_heads / world
/// of them, its own;
/// when there are fewer (vLLM's case of 8 K/V heads on 16 GPUs), each K/V head is held by
/// world / num_key_value_heads ranks (replicated), every rank holding exactly one.
///
/// Throws infer::Error for world < 1 (the message gives the world), a rank outside [0, world)
/// (the message says "rank"), a world that does not divide the query heads or the MLP units (the
/// message gives both the world and the count it does not divide), and one that neither divides
/// nor is a multiple of the K/V heads (the message says "K/V"). Where several apply, any one of
/// them will do: the tests refuse shapes that break one rule alone.
ShardPlan shard_plan(const ModelConfig& config, int rank, int world);

/// The shape of rank plan.rank's shard (given): `config` with plan.heads.size() query heads,
/// plan.kv_heads.size() K/V heads and plan.units.size() MLP units; head_dim, hidden size,
/// vocabulary and context as they are. A KVCache or SlotKVManager made for it holds this rank's
/// K/V heads only.
ModelConfig rank_config(const ModelConfig& config, const ShardPlan& plan);

/// Where a rank reads its weights from, by Hugging Face's tensor names, counting the bytes it
/// hands out. Given: file_weights() and memory_weights(). The names, for layer i:
/// `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight`, `model.layers.{i}.mlp.{gate,up,down}_proj.weight`
/// (matrices), `model.layers.{i}.input_layernorm.weight`,
/// `model.layers.{i}.post_attention_layernorm.weight` (vectors); and for the model,
/// `model.embed_tokens.weight`, `lm_head.weight` (matrices) and `model.norm.weight` (a vector).
/// `lm_head.weight` is the embedding where the model ties them, handed out, and counted, a second
/// time: the engine keeps the head as its own matrix.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  /// The whole model's shape.
  virtual const ModelConfig& config() const = 0;
  /// Rows [first, first + count) of matrix `name`, every column.
  virtual Matrix rows(const std::string& name, long first, long count) = 0;
  /// Columns [first, first + count) of matrix `name`, every row.
  virtual Matrix cols(const std::string& name, long first, long count) = 0;
  /// The whole matrix `name`.
  virtual Matrix matrix(const std::string& name) = 0;
  /// The vector `name` (a norm's gains).
  virtual Vector vector(const std::string& name) = 0;
  /// Bytes of weights handed out so far (float32 bytes of every matrix and vector returned).
  long bytes_read() const { return bytes_read_; }

 protected:
  long bytes_read_ = 0;  ///< what the implementations count
};

/// The model in `dir` (config.json, model.safetensors), read a part at a time: only the rows and
/// columns asked for are read from the file (SafetensorsFile). Throws infer::Error as load_model()
/// would for a file that does not match its config.
std::unique_ptr<WeightSource> file_weights(const std::string& dir);

/// A model already in memory (`model` must outlive the source), parts copied out of it.
std::unique_ptr<WeightSource> memory_weights(const ModelWeights& model);

/// Rank plan.rank's shard, read from `source`: its config is rank_config(); q_proj, k_proj,
/// v_proj, gate_proj and up_proj hold the rows of the plan's heads, K/V heads and units; o_proj
/// and down_proj the columns of its heads and units; the embedding, the norms and the output head
/// whole. It reads nothing else: source.bytes_read() grows by the shard's own bytes (1/world of
/// every split matrix, all of the replicated ones).
ModelWeights load_shard(WeightSource& source, const ShardPlan& plan);

/// A row-parallel product: this rank's columns of W (`shard`, [rows, cols / world], where W is
/// [rows, cols]) times this rank's columns of x, summed over the ranks. y = x W^T, complete on
/// every rank.
class RowParallelProjection final : public Projection {
 public:
  /// Over `shard`, whose sums `comm` completes (both must outlive it).
  RowParallelProjection(std::unique_ptr<Projection> shard, Communicator& comm)
      : shard_(std::move(shard)), comm_(comm) {}
  long rows() const override { return shard_->rows(); }
  long cols() const override { return shard_->cols(); }
  long bytes() const override { return shard_->bytes(); }
  /// y[:, first + i] = x W[first + i]^T summed over every rank's shard, i in [0, count) (+= with
  /// `accumulate`: what y held is added once, not once per rank); y's other columns are left as
  /// they are. x holds this rank's columns only ([x.rows, cols()]); y is the whole output
  /// ([x.rows, rows()], refused otherwise), and its columns [first, first + count) are not
  /// contiguous in memory when count < rows(). It asks its shard for rows [first, first + count)
  /// alone (the other ranks compute nothing beyond them either). The shard's own rows_into() also
  /// wants a y as wide as rows(), whatever count is, so this rank's partial sums need a scratch
  /// matrix [x.rows, rows()], and the all-reduce wants the asked columns side by side. Every rank calls it with the same first and count, in the
  /// same order, on one thread: it takes part in exactly one all-reduce, of x.rows * count floats.
  /// Throws infer::Error for shapes the shard refuses.
  void rows_into(ConstMatrixRef x, MatrixRef y, long first, long count, bool accumulate) const override;
  /// This rank's columns of W only (a measure of the shard, not of the product).
  Matrix to_float() const override { return shard_->to_float(); }

 private:
  std::unique_ptr<Projection> shard_;
  Communicator& comm_;
};

/// A rank's products for the engine's step: `projections` (its shard's, float32 or lesson 11's
/// quantized ones) with those whose partial sums must meet wrapped in RowParallelProjection over
/// `comm`, the others as they are. forward_step() over them on every rank, one thread each, gives
/// each rank the whole model's hidden states and logits.
ModelProjections tensor_parallel(ModelProjections projections, Communicator& comm);

// ===================================================== the engine on the group (given) ==

/// The forward seam over a tensor-parallel group. Every rank builds one over its shard and its
/// communicator; rank 0's goes to the Engine (with its memory), the others call follow().
///
/// Rank 0's forward() checks the step (check_step()), broadcasts it (each chunk's tokens, logits
/// and mask, and where its K/V lies), then runs forward_step() over its shard; every follower
/// runs the same step over its own K/V memory, which holds its own K/V heads. Each rank's step
/// runs on one thread (the ranks are the parallelism). The logits are rank 0's.
///
/// The memory comes in two kinds, the same on every rank:
/// - slots (lesson 03): `slots` whole-context KV caches; rank 0's engine takes them as memory(),
///   and a chunk is named by its slot's index;
/// - paged (lessons 04 and 05): a pool of num_blocks blocks of block_size positions on every
///   rank; rank 0's engine takes its pool as pool() (for PagedKVManager, or PrefixKVManager with
///   its prefix cache), and every decision about blocks (which block a position lies in, which
///   blocks a prefix shares, preemption) is rank 0's. A chunk is sent with its block table, and
///   the blocks rank 0's pool copied since the last step (copy-on-write) are copied on every rank
///   before the step: each follower's pool holds its own heads of the same positions in the same
///   blocks as rank 0's.
class TensorParallelRunner final : public ModelRunner {
 public:
  /// Over `shard` (rank_config()'s shape) and `projections` (tensor_parallel()'s), with `slots`
  /// whole-context KV caches of the shard's shape. `shard` and `comm` must outlive it.
  TensorParallelRunner(const ModelWeights& shard, ModelProjections projections, Communicator& comm, int slots);
  /// The same with paged memory: a pool of `num_blocks` blocks of `block_size` positions of the
  /// shard's shape on this rank.
  TensorParallelRunner(const ModelWeights& shard, ModelProjections projections, Communicator& comm, int num_blocks,
                       int block_size);
  /// Rank 0: tells the followers to stop (they return from follow()).
  ~TensorParallelRunner() override;
  /// The shard's shape (its K/V heads: what the memory's caches hold).
  const ModelConfig& config() const override { return shard_.config; }
  /// Rank 0 only: one step on every rank (see the class). With paged memory, each chunk's cache
  /// must have reserve()d the step's positions (the engine does): throws infer::Error otherwise.
  Matrix forward(const StepInput& step) override;
  /// Rank 0 only, once, with slots: the engine's KV memory, a SlotKVManager over them.
  std::unique_ptr<KVManager> memory();
  /// Rank 0 only, once, with paged memory: the pool for the engine's memory (PagedKVManager or
  /// PrefixKVManager over it), whose block copies this runner passes on to the other ranks.
  std::unique_ptr<KVBlockPool> pool();
  /// The other ranks: runs rank 0's steps until it stops.
  void follow();
  /// What a decode step reads of this rank's weights, in bytes.
  long weight_bytes() const { return projections_.bytes(); }

 private:
  Matrix run(const StepInput& step);
  const ModelWeights& shard_;
  ModelProjections projections_;
  Communicator& comm_;
  std::vector<std::unique_ptr<KVStore>> own_;  // a follower's slots
  std::vector<KVStore*> slots_;                // every slot, by index (rank 0's are in its memory)
  std::unique_ptr<KVBlockPool> own_pool_;      // paged: this rank's pool until rank 0's engine takes it
  KVBlockPool* pool_ = nullptr;                // paged: this rank's pool (rank 0's is in its memory)
  bool stopped_ = false;
};

}  // namespace infer
