// Lesson 03: the engine every lesson extends (given): the slot memory, the forward over a step,
// the planner of whole prompts and the engine's loop, compiled with your exercises/ and with the
// reference. The contract is lessons/03_batching/engine.hpp.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <utility>

#include "common/linear.hpp"
#include "lessons/03_batching/engine.hpp"

namespace infer {

// ------------------------------------------------------------ slot memory --

SlotKVManager::SlotKVManager(const ModelConfig& config, int slots)
    : context_(config.max_position_embeddings), slots_(slots) {
  require(slots > 0, "SlotKVManager: slots must be positive, got ", slots);
  for (int i = 0; i < slots; ++i) free_.push_back(std::make_unique<KVCache>(config, context_));
}

SlotKVManager::SlotKVManager(std::vector<std::unique_ptr<KVStore>> stores)
    : slots_(static_cast<int>(stores.size())), free_(std::move(stores)) {
  require(!free_.empty(), "SlotKVManager: no stores");
  for (size_t i = 0; i < free_.size(); ++i) {
    require(free_[i] != nullptr, "SlotKVManager: store ", i, " is null");
    require(free_[i]->max_tokens() == free_[0]->max_tokens(), "SlotKVManager: store ", i, " holds ",
            free_[i]->max_tokens(), " positions, store 0 holds ", free_[0]->max_tokens(), " (slots must be equal)");
  }
  context_ = free_[0]->max_tokens();
}

std::unique_ptr<KVStore> SlotKVManager::open(int tokens) {
  require(tokens >= 0 && tokens <= context_, "SlotKVManager::open: ", tokens, " positions, a slot holds ", context_);
  if (free_.empty()) return nullptr;
  std::unique_ptr<KVStore> store = std::move(free_.back());
  free_.pop_back();
  store->reset();
  return store;
}

void SlotKVManager::close(std::unique_ptr<KVStore> store) {
  require(store != nullptr, "SlotKVManager::close: no store");
  free_.push_back(std::move(store));
}

int SlotKVManager::preemptions_needed(std::span<const KVStore* const>) const { return 0; }
int SlotKVManager::capacity_tokens() const { return context_; }
long SlotKVManager::reserved_tokens() const { return static_cast<long>(slots_ - free_.size()) * context_; }

// ----------------------------------------------------------------- forward --

int check_step(const ModelConfig& c, const StepInput& step, const char* who) {
  const std::vector<Chunk>& chunks = step.chunks;
  require(!chunks.empty(), who, ": no chunks (expected at least one)");
  std::set<const KVStore*> seen;
  int rows = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& ch = chunks[i];
    require(!ch.tokens.empty(), who, ": chunk ", i, " is empty (expected at least one token)");
    require(ch.cache != nullptr, who, ": chunk ", i, " has no cache");
    require(seen.insert(ch.cache).second, who, ": chunk ", i, " shares its cache with another chunk");
    check_tokens(c, ch.tokens, who);
    const long end = static_cast<long>(ch.cache->length()) + static_cast<long>(ch.tokens.size());
    require(end <= std::min(ch.cache->max_tokens(), c.max_position_embeddings), who, ": chunk ", i, " of ",
            ch.tokens.size(), " tokens at position ", ch.cache->length(), " would exceed its cache (",
            ch.cache->max_tokens(), ") or the context (", c.max_position_embeddings, ")");
    require(ch.logits >= 1 && ch.logits <= static_cast<int>(ch.tokens.size()), who, ": chunk ", i, " wants the logits of ",
            ch.logits, " of its ", ch.tokens.size(), " tokens (expected 1 to that)");
    if (ch.mask) {
      const TreeMask& m = *ch.mask;
      const auto n = static_cast<Eigen::Index>(ch.tokens.size());
      require(m.rows() == n && m.cols() == n, who, ": chunk ", i, "'s mask is [", m.rows(), ", ", m.cols(),
              "], expected [", n, ", ", n, "] for its tokens");
      for (Eigen::Index r = 0; r < n; ++r) {
        require(m(r, r), who, ": chunk ", i, "'s mask hides token ", r, " from itself");
        for (Eigen::Index j = r + 1; j < n; ++j)
          require(!m(r, j), who, ": chunk ", i, "'s mask shows token ", r, " the later token ", j);
      }
    }
    rows += ch.logits;
  }
  return rows;
}

namespace {

/// Attention of a masked chunk's queries q ([n, heads * head_dim], rotated), whose K/V were just
/// appended at rows start .. start + n - 1 of `keys` and `values`: row i sees rows 0 .. start - 1
/// and the chunk's rows j with mask(i, j).
Matrix masked_attention(ConstMatrixRef q, ConstMatrixRef keys, ConstMatrixRef values, int start, const TreeMask& mask,
                        const ModelConfig& c) {
  const int n = static_cast<int>(q.rows()), d = c.head_dim, group = c.num_attention_heads / c.num_key_value_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  Matrix out = Matrix::Zero(n, q.cols());
  std::vector<float> score(static_cast<size_t>(start + n));
  for (int i = 0; i < n; ++i) {
    for (int h = 0; h < c.num_attention_heads; ++h) {
      const int kv = h / group;
      const auto qi = q.row(i).segment(h * d, d);
      float best = -INFINITY;
      for (int j = 0; j < start + n; ++j) {
        const bool visible = j < start || mask(i, j - start);
        score[j] = visible ? scale * qi.dot(keys.row(j).segment(kv * d, d)) : -INFINITY;
        best = std::max(best, score[j]);
      }
      float total = 0;
      for (int j = 0; j < start + n; ++j) total += score[j] = score[j] == -INFINITY ? 0.0f : std::exp(score[j] - best);
      for (int j = 0; j < start + n; ++j)
        if (score[j] > 0) out.row(i).segment(h * d, d) += (score[j] / total) * values.row(j).segment(kv * d, d);
    }
  }
  return out;
}

}  // namespace

namespace {

/// Runs `work` unless an earlier phase failed; keeps the first exception. Every thread of the
/// step's region passes every barrier whatever happens (a thread that left early would leave the
/// others waiting at the next one), so a failure only turns the remaining phases into no-ops.
class Phases {
 public:
  template <typename Work>
  void run(Work&& work) {
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      work();
    } catch (...) {
      const std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
      failed_ = true;
    }
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::exception_ptr error_;
};

/// This thread's rows of W, given its share of rows [offset, offset + W.rows()) of a stack of
/// products over the same x (q, k and v: one stack), into y.
void stacked_rows(ConstMatrixRef x, const Projection& w, MatrixRef y, Share mine, long offset) {
  const long first = std::max(mine.begin, offset), end = std::min(mine.end, offset + w.rows());
  if (end > first) w.rows_into(x, y, first - offset, end - first, false);
}

}  // namespace

Matrix forward_step(const ModelWeights& model, const StepInput& step) {
  return forward_step(model, float_projections(model), step);
}

Matrix forward_step(const ModelWeights& model, const ModelProjections& projections, const StepInput& step) {
  const ModelConfig& c = model.config;
  const int wanted = check_step(c, step, "forward_step");
  projections.check(c);
  const std::vector<Chunk>& chunks = step.chunks;
  std::vector<Eigen::Index> first(chunks.size());  // each chunk's first row in the stacked batch
  std::vector<int> pos(chunks.size());
  std::vector<std::vector<int>> depth(chunks.size());  // a masked chunk's positions after pos[i]
  Eigen::Index rows = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    pos[i] = chunks[i].cache->length();
    first[i] = rows;
    rows += static_cast<Eigen::Index>(chunks[i].tokens.size());
    if (chunks[i].mask)
      for (Eigen::Index t = 0; t < chunks[i].mask->rows(); ++t)
        depth[i].push_back(static_cast<int>(chunks[i].mask->row(t).count()) - 1);
  }
  const long q_dim = static_cast<long>(c.num_attention_heads) * c.head_dim;
  const long kv_dim = static_cast<long>(c.num_key_value_heads) * c.head_dim;
  const long hidden = c.hidden_size, inter = c.intermediate_size;

  Matrix x(rows, hidden);  // every chunk's rows, stacked: the residual stream
  for (size_t i = 0; i < chunks.size(); ++i)
    for (size_t t = 0; t < chunks[i].tokens.size(); ++t)
      x.row(first[i] + static_cast<Eigen::Index>(t)) = model.embed_tokens.row(chunks[i].tokens[t]);
  Matrix q(rows, q_dim), k(rows, kv_dim), v(rows, kv_dim), attn(rows, q_dim), gate(rows, inter), up(rows, inter);
  Matrix logits(wanted, c.vocab_size);
  Phases phases;
  // A step of one chunk shares out its query heads instead, a group per thread over the K/V head
  // they read, when its store attends as KVStore::attend() does, over keys() and values() (a paged
  // store reads through its block table, and a masked chunk has its own attention: one thread).
  const bool heads_apart = chunks.size() == 1 && !chunks[0].mask && chunks[0].cache->attends_over_keys();
  std::optional<std::pair<ConstMatrixRef, ConstMatrixRef>> split_heads;  // that chunk's K and V, for every thread

  // One parallel region for the whole step. Every product is split over the threads by rows of W
  // (each thread streams its own share of every matrix), and the threads meet only where the data
  // says they must, six times a layer: after q/k/v, the appends, attention, the write to x, gate
  // and up, the write to x. Opening a region per
  // product instead costs a fork and a join each (3 us apiece on a 2-core virtual machine), 30 a
  // token: more than the products themselves on a small model.
#pragma omp parallel
  {
    const int me = omp_get_thread_num(), threads = omp_get_num_threads();
    const Share my_hidden = share_of(hidden, me, threads), my_inter = share_of(inter, me, threads);
    const Share my_qkv = share_of(q_dim + 2 * kv_dim, me, threads);
    Matrix h;  // this thread's own copy of the normalized x: computing it costs less than a meeting
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const LayerWeights& layer = model.layers[l];  // its norms; its products are in `projections`
      const auto& w = projections.layers[l];
      phases.run([&] {  // q, k and v as one stack of rows
        h = rms_norm(x, layer.input_layernorm, c.rms_norm_eps);
        stacked_rows(h, *w[kQProj], q, my_qkv, 0);
        stacked_rows(h, *w[kKProj], k, my_qkv, q_dim);
        stacked_rows(h, *w[kVProj], v, my_qkv, q_dim + kv_dim);
      });
#pragma omp barrier
      // RoPE and the appends on one thread, chunk after chunk (the caches may share one block
      // pool); then attention, a chunk a thread (each reads only its own cache), or for one chunk
      // a group of query heads a thread.
      phases.run([&] {
        if (me != 0) return;
        for (size_t i = 0; i < chunks.size(); ++i) {
          const Eigen::Index r = first[i], n = static_cast<Eigen::Index>(chunks[i].tokens.size());
          if (!chunks[i].mask) {
            auto qi = q.middleRows(r, n), ki = k.middleRows(r, n);
            apply_rope(qi, c.head_dim, pos[i], c.rope_theta);
            apply_rope(ki, c.head_dim, pos[i], c.rope_theta);
          } else {
            for (Eigen::Index t = 0; t < n; ++t) {  // each token at its own depth
              auto qt = q.middleRows(r + t, 1), kt = k.middleRows(r + t, 1);
              apply_rope(qt, c.head_dim, pos[i] + depth[i][t], c.rope_theta);
              apply_rope(kt, c.head_dim, pos[i] + depth[i][t], c.rope_theta);
            }
          }
          chunks[i].cache->append(l, k.middleRows(r, n), v.middleRows(r, n));
        }
        if (heads_apart) split_heads.emplace(chunks[0].cache->keys(l), chunks[0].cache->values(l));
      });
#pragma omp barrier
      phases.run([&] {
        if (!heads_apart) {
          for (size_t i = me; i < chunks.size(); i += threads) {
            const Eigen::Index r = first[i], n = static_cast<Eigen::Index>(chunks[i].tokens.size());
            const KVStore& cache = *chunks[i].cache;
            attn.middleRows(r, n) =
                chunks[i].mask
                    ? masked_attention(q.middleRows(r, n), cache.keys(l), cache.values(l), pos[i], *chunks[i].mask, c)
                    : cache.attend(l, q.middleRows(r, n), c.num_attention_heads, c.num_key_value_heads, c.head_dim);
          }
          return;
        }
        const int d = c.head_dim, group = c.num_attention_heads / c.num_key_value_heads;
        const Share mine = share_of(c.num_key_value_heads, me, threads, 1);
        for (long g = mine.begin; g < mine.end; ++g)  // KVStore::attend()'s causal_attention, a K/V head at a time
          attn.middleCols(g * group * d, group * d) =
              causal_attention(q.middleCols(g * group * d, group * d), split_heads->first.middleCols(g * d, d),
                               split_heads->second.middleCols(g * d, d), group, 1, d);
      });
#pragma omp barrier
      phases.run([&] { w[kOProj]->rows_into(attn, x, my_hidden.begin, my_hidden.size(), true); });
#pragma omp barrier
      phases.run([&] {  // the MLP's gate and up, each thread for its own units, then silu(gate) * up
        h = rms_norm(x, layer.post_attention_layernorm, c.rms_norm_eps);
        w[kGateProj]->rows_into(h, gate, my_inter.begin, my_inter.size(), false);
        w[kUpProj]->rows_into(h, up, my_inter.begin, my_inter.size(), false);
        auto g = gate.middleCols(my_inter.begin, my_inter.size()).array();
        g = g / (1.0f + (-g).exp()) * up.middleCols(my_inter.begin, my_inter.size()).array();
      });
#pragma omp barrier
      phases.run([&] { w[kDownProj]->rows_into(gate, x, my_hidden.begin, my_hidden.size(), true); });
#pragma omp barrier
    }
    phases.run([&] {  // only the wanted rows go through the head; each thread its share of the vocabulary
      Matrix last(wanted, hidden);
      Eigen::Index row = 0;
      for (size_t i = 0; i < chunks.size(); ++i) {
        const Eigen::Index end = first[i] + static_cast<Eigen::Index>(chunks[i].tokens.size());
        last.middleRows(row, chunks[i].logits) = x.middleRows(end - chunks[i].logits, chunks[i].logits);
        row += chunks[i].logits;
      }
      const Share my_vocab = share_of(c.vocab_size, me, threads);
      h = rms_norm(last, model.norm, c.rms_norm_eps);
      projections.lm_head->rows_into(h, logits, my_vocab.begin, my_vocab.size(), false);
    });
  }
  phases.rethrow();
  return logits;
}


// ----------------------------------------------------------------- engine --

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::None: break;
  }
  return "";
}

std::vector<Planned> WholePrompts::plan(Engine& engine) {
  std::vector<Planned> plan;
  engine.make_room();
  for (const auto& s : engine.running())
    if (!s->done()) plan.push_back({s.get(), s->uncomputed()});  // a decode: its one sampled token
  while (Sequence* s = engine.admit_next()) plan.push_back({s, s->uncomputed()});
  return plan;
}

Engine::Engine(const ModelWeights& model, Policy policy, int max_running, std::unique_ptr<KVManager> memory)
    : Engine(std::make_unique<CpuRunner>(model),
             memory ? std::move(memory) : std::make_unique<SlotKVManager>(model.config, std::max(1, max_running)),
             EngineOptions{.policy = policy, .max_running = max_running}) {}

Engine::Engine(std::unique_ptr<ModelRunner> runner, std::unique_ptr<KVManager> memory, EngineOptions options,
               std::unique_ptr<Planner> planner, std::unique_ptr<Speculator> speculator)
    : runner_(std::move(runner)),
      memory_(std::move(memory)),
      options_(options),
      planner_(planner ? std::move(planner) : std::make_unique<WholePrompts>()),
      speculator_(std::move(speculator)),
      queue_(options.policy, std::max(1, options.max_running)) {
  require(runner_ != nullptr, "Engine: no model runner");
  require(memory_ != nullptr, "Engine: no KV memory");
  require(options_.max_running >= 1, "Engine: max_running must be >= 1, got ", options_.max_running);
  require(options_.speculative_tokens >= 0, "Engine: speculative_tokens must be >= 0, got ",
          options_.speculative_tokens);
  require(options_.speculative_tokens == 0 || speculator_ != nullptr, "Engine: speculative_tokens ",
          options_.speculative_tokens, " needs a Speculator to propose them");
}

Engine::~Engine() = default;

void Engine::submit(GenerationRequest r) {
  const ModelConfig& c = runner_->config();
  check_tokens(c, r.prompt, "Engine::submit");
  r.sampling.validate();
  require(r.logprobs >= -1, "Engine::submit: request ", r.id, " asks for ", r.logprobs,
          " log-probabilities, expected -1 (none) or more");
  require(r.max_new_tokens >= 1, "Engine::submit: request ", r.id, " asks for ", r.max_new_tokens,
          " new tokens, expected >= 1");
  const size_t need = r.prompt.size() + static_cast<size_t>(r.max_new_tokens);
  require(need <= static_cast<size_t>(c.max_position_embeddings), "Engine::submit: request ", r.id, ": prompt of ",
          r.prompt.size(), " tokens + max_new_tokens ", r.max_new_tokens, " exceeds the context of ",
          c.max_position_embeddings, " positions");
  require(need <= static_cast<size_t>(memory_->capacity_tokens()), "Engine::submit: request ", r.id, ": prompt of ",
          r.prompt.size(), " tokens + max_new_tokens ", r.max_new_tokens, " exceeds the ", memory_->capacity_tokens(),
          " positions the KV memory can give one sequence");
  require(!live_.contains(r.id), "Engine::submit: request id ", r.id, " was already submitted (and is still in the engine)");
  if (next_ticket_ > 0)  // (require() evaluates its message's parts even when the check passes)
    require(r.arrival_step >= last_arrival_, "Engine::submit: request ", r.id, " arrives at step ", r.arrival_step,
            ", before the previous request (", last_arrival_, "): submit in arrival order");
  const long ticket = next_ticket_++;
  queue_.add(queue_id(ticket), r.arrival_step);
  last_arrival_ = r.arrival_step;
  const GenerationResult result{r.id, {}, r.arrival_step, 0, 0, 0, 0, FinishReason::None};
  std::vector<int> tokens = r.prompt;
  Sampler sampler(r.sampling);
  auto seq = std::unique_ptr<Sequence>(
      new Sequence{std::move(r), ticket, std::move(tokens), std::move(sampler), nullptr, 0, result, nullptr});
  live_.emplace(seq->request.id, ticket);
  waiting_.emplace(queue_id(ticket), std::move(seq));
}

void Engine::leave(std::unique_ptr<Sequence> seq, int finish_step) {
  if (seq->cache) memory_->close(std::move(seq->cache));
  seq->result.finish_step = finish_step;
  seq->result.tokens.assign(seq->tokens.begin() + static_cast<long>(seq->request.prompt.size()), seq->tokens.end());
  live_.erase(seq->request.id);
  finished_.emplace_back(seq->ticket, std::move(seq->result));
}

bool Engine::cancel(int id) {
  const auto it = live_.find(id);
  if (it == live_.end()) return false;
  const long ticket = it->second;
  const auto run = std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return s->ticket == ticket; });
  std::unique_ptr<Sequence> seq;
  if (run != running_.end()) {
    if ((*run)->done()) return false;  // finished, waiting for its static batch: it leaves with it
    seq = std::move(*run);
    running_.erase(run);
  } else {
    const auto w = waiting_.find(queue_id(ticket));
    seq = std::move(w->second);  // its ticket stays queued: admit_next() skips it
    waiting_.erase(w);
  }
  seq->result.finish = FinishReason::Cancelled;
  leave(std::move(seq), now_);
  return true;
}

int Engine::make_room() {
  std::vector<const KVStore*> stores;
  for (const auto& s : running_)
    if (!s->done()) stores.push_back(s->cache.get());
  const int victims = memory_->make_room(stores);
  require(victims >= 0 && victims <= static_cast<int>(stores.size()), "Engine: the KV memory asks to preempt ",
          victims, " of ", stores.size(), " running sequences");
  for (int n = 0; n < victims; ++n) {
    auto newest = std::find_if(running_.rbegin(), running_.rend(), [](const auto& s) { return !s->done(); });
    std::unique_ptr<Sequence> victim = std::move(*newest);
    running_.erase(std::next(newest).base());
    memory_->close(std::move(victim->cache));  // not release(): what it frees must stay free
    ++victim->result.preemptions;
    queue_.push_front(queue_id(victim->ticket), victim->request.arrival_step);
    waiting_.emplace(queue_id(victim->ticket), std::move(victim));  // keeps its tokens and its sampler
  }
  current_.preempted += victims;
  return victims;
}

void Engine::give_back_admitted() {
  for (auto it = admitted_.begin(); it != admitted_.end(); ++it)  // newest first: the oldest ends at the head
    if (waiting_.contains(*it)) queue_.push_front(*it, waiting_.at(*it)->request.arrival_step);
  admitted_.clear();
}

Sequence* Engine::admit_next() {
  // Nobody in a step that had to preempt: memory is short, and admitting now would hand the
  // blocks just freed to a newcomer (or straight back to the sequence preempted) only to preempt
  // again at the next step.
  if (current_.preempted > 0) return nullptr;
  int id = -1;  // in the queue
  while (id < 0) {
    if (admitted_.empty()) {  // ask the Scheduler; what it lets in is handed out one per call
      const int taken = static_cast<int>(running_.size());
      for (const int t : queue_.admit(now_, taken)) admitted_.push_back(t);
      std::reverse(admitted_.begin(), admitted_.end());  // back() is the oldest
      if (admitted_.empty()) return nullptr;
    }
    const int t = admitted_.back();
    admitted_.pop_back();
    if (waiting_.contains(t)) id = t;  // (else cancelled while it waited: dropped)
  }
  Sequence& seq = *waiting_.at(id);
  auto give_back = [&] {  // whatever else the Scheduler let in, and it, wait at the head again
    give_back_admitted();
    queue_.push_front(id, seq.request.arrival_step);
  };
  seq.cache = memory_->open_for(seq.tokens);
  // This step's decodes come first: a newcomer may not take the memory one of them needs for its
  // next position (make_room() made sure it was there).
  std::vector<const KVStore*> others;
  for (const auto& s : running_)
    if (!s->done()) others.push_back(s->cache.get());
  if (seq.cache && !others.empty() && memory_->make_room(others) > 0) memory_->close(std::move(seq.cache));
  if (!seq.cache) {
    if (running_.empty())
      throw Error(cat("Engine: the KV memory cannot hold request ", seq.request.id, "'s ", seq.tokens.size(),
                      " positions even with nothing else running"));
    give_back();
    return nullptr;
  }
  if (seq.result.preemptions == 0) seq.result.cached_tokens = seq.computed();  // at its first start
  if (seq.result.preemptions > 0) ++current_.resumed;
  ++current_.admitted;
  seq.prefill_end = static_cast<int>(seq.tokens.size());
  running_.push_back(std::move(waiting_.extract(id).mapped()));
  started_.push_back(running_.back().get());
  return running_.back().get();
}

void fill_logprobs(TokenEvent& event, ConstMatrixRef logits, int n) {
  if (n < 0) return;
  const float best = logits.maxCoeff();  // the log-softmax of the row, stable
  const float log_total = best + std::log((logits.array() - best).exp().sum());
  event.logprob = logits(0, event.token) - log_total;
  std::vector<int> ids(static_cast<size_t>(logits.cols()));
  std::iota(ids.begin(), ids.end(), 0);
  const auto most = ids.begin() + std::min<long>(n, static_cast<long>(ids.size()));
  std::partial_sort(ids.begin(), most, ids.end(),
                    [&](int a, int b) { return logits(0, a) > logits(0, b) || (logits(0, a) == logits(0, b) && a < b); });
  event.top.clear();
  for (auto it = ids.begin(); it != most; ++it) event.top.emplace_back(*it, logits(0, *it) - log_total);
}

TokenEvent Engine::take_token(Sequence& s, int token, ConstMatrixRef logits) {
  TokenEvent event{s.request.id, token};
  fill_logprobs(event, logits, s.request.logprobs);
  if (s.generated() == 0) s.result.first_token_step = now_;
  s.tokens.push_back(token);
  FinishReason finish = FinishReason::None;
  if (token == runner_->config().eos_token_id) finish = FinishReason::Stop;
  else if (s.generated() == s.request.max_new_tokens) finish = FinishReason::Length;
  if (finish != FinishReason::None) {
    s.result.finish = finish;
    memory_->release(std::move(s.cache), s.tokens);  // a prefix cache keeps what it computed
  }
  event.finish = finish;
  return event;
}

std::vector<int> Engine::guesses(Sequence& s) {
  if (!speculator_ || options_.speculative_tokens == 0 || !s.decoding()) return {};
  const int fed = static_cast<int>(s.tokens.size());  // after the step: its sampled token computed
  const int room = std::min(s.cache->max_tokens(), runner_->config().max_position_embeddings) - fed;
  const int k = std::min({options_.speculative_tokens, s.request.max_new_tokens - s.generated() - 1, room});
  if (k <= 0) return {};
  std::vector<int> g = speculator_->propose(s, k);
  require(static_cast<int>(g.size()) <= k, "Engine: the speculator proposed ", g.size(), " guesses for request ",
          s.request.id, ", asked for at most ", k);
  if (g.empty()) return g;
  check_tokens(runner_->config(), g, "Engine: a speculator's guesses");
  // Guesses take only what is free: the step's own positions are reserved already, and
  // reserve() is all or nothing, so a store the memory cannot grow that far now just decodes.
  // (With the positions checked above, running out of blocks is the only refusal left.)
  try {
    s.cache->reserve(fed + static_cast<int>(g.size()));
  } catch (const Error&) {
    return {};
  }
  return g;
}

std::vector<int> Engine::verify(Sequence& s, ConstMatrixRef logits, std::span<const int> guesses) {
  std::vector<int> kept = speculator_->verify(s, logits, guesses);
  const size_t n = kept.size();
  require(n >= 1 && n <= guesses.size() + 1 && std::equal(kept.begin(), kept.end() - 1, guesses.begin()),
          "Engine: the speculator's verdict for request ", s.request.id, " is not a prefix of its ", guesses.size(),
          " guesses and one token of the model's");
  current_.accepted += static_cast<int>(n) - 1;
  // Its tokens end at the first EOS (max_new_tokens bounded the guesses already).
  const auto eos = std::find(kept.begin(), kept.end(), runner_->config().eos_token_id);
  if (eos != kept.end()) kept.erase(eos + 1, kept.end());
  // The store keeps every token but the new last one: the fed token and the guesses kept before
  // it were computed where they now stand; the rest of the guesses go.
  s.cache->truncate(static_cast<int>(s.tokens.size() + kept.size()) - 1);
  return kept;
}

std::vector<TokenEvent> Engine::step() {
  std::vector<TokenEvent> events;
  if (idle()) return events;
  current_ = EngineStepLog{};
  current_.step = now_;

  // 1. Plan.
  const std::vector<Planned> plan = planner_->plan(*this);
  give_back_admitted();  // let in by the Scheduler, not taken by the planner: they wait
  std::vector<const Sequence*> seen;
  for (const Planned& p : plan) {
    require(p.seq != nullptr && std::any_of(running_.begin(), running_.end(), [&](const auto& s) { return s.get() == p.seq; }),
            "Engine: the plan names a sequence that is not running");
    require(std::find(seen.begin(), seen.end(), p.seq) == seen.end(), "Engine: the plan names request ",
            p.seq->request.id, " twice");
    seen.push_back(p.seq);
    require(!p.seq->done(), "Engine: the plan feeds request ", p.seq->request.id, ", which is done");
    require(p.tokens >= 1 && p.tokens <= p.seq->uncomputed(), "Engine: the plan feeds request ", p.seq->request.id,
            " ", p.tokens, " tokens; it has ", p.seq->uncomputed(), " to feed (expected 1 to that)");
    if (p.seq->decoding()) {
      ++current_.decodes;
    } else {
      ++current_.prefills;
      current_.prefill_tokens += p.tokens;
    }
  }
  for (const Sequence* s : started_)
    require(std::find(seen.begin(), seen.end(), s) != seen.end(), "Engine: the plan admits request ", s->request.id,
            " and feeds it nothing (admit only whom the step feeds: admission takes memory and a place)");
  started_.clear();
  current_.occupied = static_cast<int>(running_.size());
  // Memory for what each sequence feeds is taken now, while planning (make_room() left enough):
  // a paged store takes its new blocks and copies a shared one here, and the forward only writes.
  for (const Planned& p : plan) {
    try {
      p.seq->cache->reserve(p.seq->computed() + p.tokens);
    } catch (const NotImplemented&) {
      throw;  // a lesson's unfinished store says so itself
    } catch (const Error& e) {
      throw Error(cat("Engine: the plan feeds request ", p.seq->request.id, " positions ", p.seq->computed(), " to ",
                      p.seq->computed() + p.tokens, " and the memory cannot hold them (did the planner call "
                      "make_room() first, and plan no more than the room it left?): ", e.what()));
    }
  }

  // 2. Run: every planned sequence feeds its next uncomputed tokens, all in one forward; a decode
  //    with a speculator feeds its guesses too, with logits at each of them.
  if (!plan.empty()) {
    std::vector<std::vector<int>> fed(plan.size());  // a speculative decode's token, then its guesses
    StepInput input;
    for (size_t i = 0; i < plan.size(); ++i) {
      Sequence& s = *plan[i].seq;
      Chunk chunk{std::span(s.tokens).subspan(static_cast<size_t>(s.computed()), static_cast<size_t>(plan[i].tokens)),
                  s.cache.get(), s.request.id};
      if (const std::vector<int> g = guesses(s); !g.empty()) {
        fed[i].push_back(s.tokens.back());
        fed[i].insert(fed[i].end(), g.begin(), g.end());
        chunk.tokens = fed[i];
        chunk.logits = static_cast<int>(fed[i].size());
        current_.proposed += static_cast<int>(g.size());
      }
      input.chunks.push_back(chunk);
    }
    const Matrix logits = runner_->forward(input);
    current_.forwards = 1;

    // 3. Sample: who has nothing left to feed.
    Eigen::Index row = 0;
    for (size_t i = 0; i < plan.size(); ++i) {
      Sequence& s = *plan[i].seq;
      const int rows = input.chunks[i].logits;
      const auto mine = logits.middleRows(row, rows);
      row += rows;
      if (!fed[i].empty()) {
        const std::vector<int> kept = verify(s, mine, std::span(fed[i]).subspan(1));
        for (size_t j = 0; j < kept.size(); ++j)  // row j: the model's logits where kept[j] goes
          events.push_back(take_token(s, kept[j], mine.middleRows(static_cast<Eigen::Index>(j), 1)));
        continue;
      }
      if (s.uncomputed() > 0) continue;  // a piece of its prefill: more to come
      events.push_back(take_token(s, s.sampler.next(mine.row(0).transpose()), mine.topRows(1)));
    }
  }

  // 4. Retire: at once (continuous), or when the whole batch is done (static, which hands back
  //    every member's result at that moment).
  const bool all_done = std::all_of(running_.begin(), running_.end(), [](const auto& s) { return s->done(); });
  if (options_.policy == Policy::Continuous || all_done)
    for (auto it = running_.begin(); it != running_.end();) {
      if (!(*it)->done()) {
        ++it;
        continue;
      }
      std::unique_ptr<Sequence> seq = std::move(*it);
      it = running_.erase(it);
      leave(std::move(seq), now_ + 1);
    }
  for (const auto& s : running_) current_.stored_tokens += s->computed();
  current_.reserved_tokens = memory_->reserved_tokens();
  if (!options_.keep_log) log_.clear();
  log_.push_back(current_);
  ++now_;
  return events;
}

std::vector<GenerationResult> Engine::take_finished() {
  std::vector<GenerationResult> out;
  out.reserve(finished_.size());
  for (auto& [ticket, result] : finished_) out.push_back(std::move(result));
  finished_.clear();
  return out;
}

std::vector<GenerationResult> Engine::run() {
  while (!idle()) step();
  std::stable_sort(finished_.begin(), finished_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return take_finished();
}

}  // namespace infer
