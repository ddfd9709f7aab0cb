// Lesson 03: what is given to students (the Scheduler's queue, the slot memory, the engine's
// forward over a step, and the engine that runs your scheduler), compiled with your exercises/
// and with the reference.
#include "lessons/03_batching/batching.hpp"

#include <algorithm>
#include <set>

#include "common/linear.hpp"

namespace infer {

Scheduler::Scheduler(Policy policy, int max_batch) : policy_(policy), max_batch_(max_batch) {
  require(max_batch > 0, "Scheduler: max_batch must be positive, got ", max_batch);
}

void Scheduler::add(int id, int arrival_step) {
  // (Not one require(): its message arguments are evaluated even when the condition holds.)
  if (!queue_.empty() && arrival_step < queue_.back().arrival)
    throw Error(cat("Scheduler::add: request ", id, " arrives at step ", arrival_step, ", before the last queued one (",
                    queue_.back().arrival, "): add requests in arrival order"));
  queue_.push_back({id, arrival_step});
}

void Scheduler::push_front(int id, int arrival_step) { queue_.push_front({id, arrival_step}); }

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

void check_step(const ModelConfig& c, const StepInput& step, const char* who) {
  const std::vector<Chunk>& chunks = step.chunks;
  require(!chunks.empty(), who, ": no chunks (expected at least one)");
  std::set<const KVStore*> seen;
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
  }
}

Matrix forward_step(const ModelWeights& model, const StepInput& step) {
  const ModelConfig& c = model.config;
  check_step(c, step, "forward_step");
  const std::vector<Chunk>& chunks = step.chunks;
  std::vector<Eigen::Index> first(chunks.size());  // each chunk's first row in the stacked batch
  std::vector<int> pos(chunks.size());
  Eigen::Index rows = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    pos[i] = chunks[i].cache->length();
    first[i] = rows;
    rows += static_cast<Eigen::Index>(chunks[i].tokens.size());
  }

  Matrix x(rows, c.hidden_size);  // every chunk's rows, stacked
  for (size_t i = 0; i < chunks.size(); ++i)
    for (size_t t = 0; t < chunks[i].tokens.size(); ++t)
      x.row(first[i] + static_cast<Eigen::Index>(t)) = model.embed_tokens.row(chunks[i].tokens[t]);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& layer = model.layers[l];
    const Matrix h = rms_norm(x, layer.input_layernorm, c.rms_norm_eps);
    Matrix q = linear(h, layer.q_proj);  // the whole step in one product
    Matrix k = linear(h, layer.k_proj);
    const Matrix v = linear(h, layer.v_proj);
    Matrix attn(rows, q.cols());
    for (size_t i = 0; i < chunks.size(); ++i) {  // attention is per sequence: each has its own past
      const Eigen::Index r = first[i], n = static_cast<Eigen::Index>(chunks[i].tokens.size());
      auto qi = q.middleRows(r, n), ki = k.middleRows(r, n);
      apply_rope(qi, c.head_dim, pos[i], c.rope_theta);
      apply_rope(ki, c.head_dim, pos[i], c.rope_theta);
      chunks[i].cache->append(l, k.middleRows(r, n), v.middleRows(r, n));
      attn.middleRows(r, n) =
          chunks[i].cache->attend(l, q.middleRows(r, n), c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    }
    x += linear(attn, layer.o_proj);
    x += swiglu_mlp(rms_norm(x, layer.post_attention_layernorm, c.rms_norm_eps), layer);
  }
  Matrix last(static_cast<Eigen::Index>(chunks.size()), c.hidden_size);  // only the last rows need logits
  for (size_t i = 0; i < chunks.size(); ++i)
    last.row(static_cast<Eigen::Index>(i)) = x.row(first[i] + static_cast<Eigen::Index>(chunks[i].tokens.size()) - 1);
  return linear(rms_norm(last, model.norm, c.rms_norm_eps), model.lm_head);
}

// ----------------------------------------------------------------- engine --

BatchEngine::BatchEngine(const ModelWeights& model, Policy policy, int max_batch)
    : BatchEngine(model, policy, max_batch, std::make_unique<SlotKVManager>(model.config, max_batch)) {}

BatchEngine::BatchEngine(const ModelWeights& model, Policy policy, int max_batch, std::unique_ptr<KVManager> memory)
    : BatchEngine(std::make_unique<CpuRunner>(model), policy, max_batch, std::move(memory)) {}

BatchEngine::BatchEngine(std::unique_ptr<ModelRunner> runner, Policy policy, int max_batch,
                         std::unique_ptr<KVManager> memory)
    : runner_(std::move(runner)), scheduler_(policy, max_batch), memory_(std::move(memory)) {
  require(runner_ != nullptr, "BatchEngine: no model runner");
  require(memory_ != nullptr, "BatchEngine: no KV memory");
}

BatchEngine::~BatchEngine() = default;

void BatchEngine::submit(GenerationRequest r) {
  const ModelConfig& c = runner_->config();
  check_tokens(c, r.prompt, "BatchEngine::submit");
  r.sampling.validate();
  require(r.max_new_tokens >= 1, "BatchEngine::submit: request ", r.id, " asks for ", r.max_new_tokens,
          " new tokens, expected >= 1");
  require(r.prompt.size() + r.max_new_tokens <= static_cast<size_t>(c.max_position_embeddings),
          "BatchEngine::submit: request ", r.id, ": prompt of ", r.prompt.size(), " tokens + max_new_tokens ",
          r.max_new_tokens, " exceeds the context of ", c.max_position_embeddings, " positions");
  require(r.prompt.size() + r.max_new_tokens <= static_cast<size_t>(memory_->capacity_tokens()),
          "BatchEngine::submit: request ", r.id, ": prompt of ", r.prompt.size(), " tokens + max_new_tokens ",
          r.max_new_tokens, " exceeds the ", memory_->capacity_tokens(), " positions the KV memory can give one sequence");
  for (const auto& q : requests_) require(q.id != r.id, "BatchEngine::submit: request id ", r.id, " was already submitted");
  scheduler_.add(static_cast<int>(requests_.size()), r.arrival_step);  // the scheduler sees submission indices
  results_.push_back({r.id, {}, r.arrival_step, 0, 0, 0});
  requests_.push_back(std::move(r));
  paused_.emplace_back();
}

void BatchEngine::preempt(std::unique_ptr<Running> r) {
  const size_t index = r->index;
  memory_->close(std::move(r->cache));  // not release(): memory is short, and what it frees must stay free
  ++results_[index].preemptions;
  scheduler_.push_front(static_cast<int>(index), requests_[index].arrival_step);
  paused_[index] = std::move(r);  // keeps its sampler and its tokens
}

void BatchEngine::admit(EngineStepLog& entry) {
  const std::vector<int> admitted = scheduler_.admit(now_, static_cast<int>(running_.size()));
  auto give_back = [&](size_t from) {
    for (size_t b = admitted.size(); b-- > from;) scheduler_.push_front(admitted[b], requests_[admitted[b]].arrival_step);
  };
  for (size_t a = 0; a < admitted.size(); ++a) {
    const size_t index = static_cast<size_t>(admitted[a]);
    std::unique_ptr<Running> seq = std::move(paused_[index]);  // a preempted one keeps its sampler and tokens
    const bool resuming = seq != nullptr;
    if (!resuming) seq = std::make_unique<Running>(Running{index, Sampler(requests_[index].sampling), nullptr, requests_[index].prompt, false});
    seq->cache = memory_->open_for(seq->tokens);
    // This step's decodes come first: a newcomer may not take the memory one of them needs for
    // its next position (make_room() made sure it was there).
    std::vector<const KVStore*> decoding;
    for (const auto& r : running_)
      if (!r->done) decoding.push_back(r->cache.get());
    if (seq->cache && !decoding.empty() && memory_->make_room(decoding) > 0) memory_->close(std::move(seq->cache));
    if (!seq->cache) {
      if (running_.empty())
        throw Error(cat("BatchEngine: the KV memory cannot hold request ", requests_[index].id, "'s ",
                        seq->tokens.size(), " positions even with nothing else running"));
      if (resuming) paused_[index] = std::move(seq);
      give_back(a);
      return;
    }
    if (resuming) {
      ++entry.resumed;
    } else {
      results_[index].cached_tokens = seq->computed();
      results_[index].first_token_step = now_;
      ++entry.prefills;
    }
    entry.prefill_tokens += static_cast<long>(seq->tokens.size()) - seq->computed();
    running_.push_back(std::move(seq));
  }
}

bool BatchEngine::step() {
  if (running_.empty() && scheduler_.waiting() == 0) return false;
  EngineStepLog entry;
  entry.step = now_;

  // 1. Room: each sequence about to decode must be able to store one more position. Preempt
  //    the newest until the memory says the rest fit.
  std::vector<const KVStore*> stores;
  for (const auto& r : running_)
    if (!r->done) stores.push_back(r->cache.get());
  const int victims = memory_->make_room(stores);
  require(victims >= 0 && victims <= static_cast<int>(stores.size()), "BatchEngine: the KV memory asks to preempt ",
          victims, " of ", stores.size(), " running sequences");
  for (int n = 0; n < victims; ++n) {
    auto newest = std::find_if(running_.rbegin(), running_.rend(), [](const auto& r) { return !r->done; });
    std::unique_ptr<Running> victim = std::move(*newest);
    running_.erase(std::next(newest).base());
    preempt(std::move(victim));
    ++entry.preempted;
  }

  // 2. Plan: the running sequences decode; then admissions, while the memory holds them. Not in
  //    a step that had to preempt: memory is short, and admitting now would hand the blocks just
  //    freed to a newcomer (or straight back to the sequence preempted) only to preempt again at
  //    the next step.
  for (const auto& r : running_)
    if (!r->done) ++entry.decodes;
  if (entry.preempted == 0) admit(entry);
  entry.occupied = static_cast<int>(running_.size());

  // 3. Run: each sequence feeds the tokens it has not computed, all in one forward.
  StepInput input;
  std::vector<Running*> fed;
  for (auto& r : running_)
    if (!r->done) {
      input.chunks.push_back({std::span(r->tokens).subspan(static_cast<size_t>(r->computed())), r->cache.get(),
                              requests_[r->index].id});
      fed.push_back(r.get());
    }
  if (!fed.empty()) {
    const Matrix logits = runner_->forward(input);

    // 4. Sample, and record every new token; a sequence ends at EOS or its limit, and its memory
    //    is free.
    for (size_t i = 0; i < fed.size(); ++i) {
      Running& r = *fed[i];
      const int token = r.sampler.next(logits.row(static_cast<Eigen::Index>(i)).transpose());
      GenerationResult& res = results_[r.index];
      res.tokens.push_back(token);
      r.tokens.push_back(token);
      if (token == runner_->config().eos_token_id ||
          static_cast<int>(res.tokens.size()) == requests_[r.index].max_new_tokens) {
        r.done = true;
        res.finish_step = now_ + 1;
        memory_->release(std::move(r.cache), r.tokens);
      }
    }
  }
  // 5. Free slots: at once (continuous), or when the whole batch is done (static, which hands
  //    back every member's result at that moment).
  const bool all_done = std::all_of(running_.begin(), running_.end(), [](const auto& r) { return r->done; });
  if (scheduler_.policy() == Policy::Continuous || all_done) {
    if (scheduler_.policy() == Policy::Static)
      for (auto& r : running_) results_[r->index].finish_step = now_ + 1;
    std::erase_if(running_, [](const auto& r) { return r->done; });
  }
  for (const auto& r : running_) entry.stored_tokens += r->computed();
  entry.reserved_tokens = memory_->reserved_tokens();
  log_.push_back(entry);
  ++now_;
  return true;
}

std::vector<GenerationResult> BatchEngine::run() {
  while (step()) {
  }
  return results_;
}

}  // namespace infer
