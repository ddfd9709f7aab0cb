// Lesson 03: what is given to students (the Scheduler's queue, the slot memory, and the engine
// that runs your scheduler and your batched forward), compiled with your exercises/ and with the reference.
#include "lessons/03_batching/batching.hpp"

#include <algorithm>

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

// --------------------------------------------------------------- backends --

Vector CpuForward::prefill(std::span<const int> tokens, KVStore& cache) {
  const Matrix logits = forward_cached(model_, tokens, cache);
  return logits.row(logits.rows() - 1).transpose();
}

Matrix CpuForward::decode(std::span<const int> tokens, std::span<KVStore* const> caches) {
  return forward_batch(model_, tokens, caches);
}

// ----------------------------------------------------------------- engine --

BatchEngine::BatchEngine(const ModelWeights& model, Policy policy, int max_batch)
    : BatchEngine(model, policy, max_batch, std::make_unique<SlotKVManager>(model.config, max_batch)) {}

BatchEngine::BatchEngine(const ModelWeights& model, Policy policy, int max_batch, std::unique_ptr<KVManager> memory)
    : BatchEngine(std::make_unique<CpuForward>(model), policy, max_batch, std::move(memory)) {}

BatchEngine::BatchEngine(std::unique_ptr<ForwardBackend> forward, Policy policy, int max_batch,
                         std::unique_ptr<KVManager> memory)
    : forward_(std::move(forward)), scheduler_(policy, max_batch), memory_(std::move(memory)) {
  require(forward_ != nullptr, "BatchEngine: no forward backend");
  require(memory_ != nullptr, "BatchEngine: no KV memory");
}

BatchEngine::~BatchEngine() = default;

void BatchEngine::submit(GenerationRequest r) {
  const ModelConfig& c = forward_->config();
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

std::vector<int> BatchEngine::stored_tokens(size_t index) const {
  std::vector<int> tokens = requests_[index].prompt;
  const std::vector<int>& generated = results_[index].tokens;
  tokens.insert(tokens.end(), generated.begin(), generated.end());
  return tokens;
}

void BatchEngine::preempt(std::unique_ptr<Running> r) {
  const size_t index = r->index;
  memory_->close(std::move(r->cache));  // not release(): memory is short, and what it frees must stay free
  ++results_[index].preemptions;
  scheduler_.push_front(static_cast<int>(index), requests_[index].arrival_step);
  paused_[index] = std::move(r);  // keeps its sampler and its next token
}

Vector BatchEngine::start(size_t index, std::unique_ptr<KVStore> cache, long& computed) {
  // A new request runs its prompt; a preempted one recomputes the K/V of its prompt and of every
  // generated token but the last, which was sampled and not yet fed (its next_token): its sampler
  // continues where it stopped. Either way only the positions the store does not already hold
  // (a prefix cache's hit) are computed.
  const GenerationRequest& req = requests_[index];
  const bool resuming = paused_[index] != nullptr;
  std::vector<int> tokens = stored_tokens(index);
  if (resuming) tokens.pop_back();
  const int cached = cache->length();
  computed += static_cast<long>(tokens.size()) - cached;
  if (resuming) {
    running_.push_back(std::move(paused_[index]));
    running_.back()->cache = std::move(cache);
  } else {
    results_[index].cached_tokens = cached;
    running_.push_back(std::make_unique<Running>(Running{index, Sampler(req.sampling), std::move(cache), 0, false}));
  }
  const Vector logits = forward_->prefill(std::span(tokens).subspan(cached), *running_.back()->cache);
  return resuming ? Vector() : logits;
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

  // 2. Decode the running sequences: one batched forward.
  std::vector<Running*> sampling;  // sequences that get a new token this step
  std::vector<int> tokens;
  std::vector<KVStore*> caches;
  for (auto& r : running_)
    if (!r->done) {
      sampling.push_back(r.get());
      tokens.push_back(r->next_token);
      caches.push_back(r->cache.get());
    }
  std::vector<int> sampled;
  if (!sampling.empty()) {
    const Matrix logits = forward_->decode(tokens, caches);
    for (size_t i = 0; i < sampling.size(); ++i) sampled.push_back(sampling[i]->sampler.next(logits.row(i).transpose()));
  }
  entry.decodes = static_cast<int>(sampling.size());

  // 3. Admit, in queue order, while the memory holds what each needs; give the rest back. Not
  //    in a step that had to preempt: memory is short, and admitting now would hand the blocks
  //    just freed to a newcomer (or straight back to the sequence preempted) only to preempt
  //    again at the next step.
  std::vector<int> admitted;
  if (entry.preempted == 0) admitted = scheduler_.admit(now_, static_cast<int>(running_.size()));
  for (size_t a = 0; a < admitted.size(); ++a) {
    const size_t index = static_cast<size_t>(admitted[a]);
    std::vector<int> tokens = stored_tokens(index);
    if (paused_[index]) tokens.pop_back();  // its last token is fed by the next decode
    const int positions = static_cast<int>(tokens.size());
    std::unique_ptr<KVStore> cache = memory_->open_for(tokens);
    if (!cache) {
      if (running_.empty())
        throw Error(cat("BatchEngine: the KV memory cannot hold request ", requests_[index].id, "'s ", positions,
                        " positions even with nothing else running"));
      for (size_t b = admitted.size(); b-- > a;)
        scheduler_.push_front(admitted[b], requests_[admitted[b]].arrival_step);
      break;
    }
    const bool resuming = paused_[index] != nullptr;
    const Vector logits = start(index, std::move(cache), entry.prefill_tokens);
    if (resuming) {
      ++entry.resumed;
      continue;
    }
    sampling.push_back(running_.back().get());
    sampled.push_back(running_.back()->sampler.next(logits));
    results_[index].first_token_step = now_;
    ++entry.prefills;
  }
  entry.occupied = static_cast<int>(running_.size());

  // 4. Record every new token; a sequence ends at EOS or its limit, and its memory is free.
  for (size_t i = 0; i < sampling.size(); ++i) {
    Running& r = *sampling[i];
    GenerationResult& res = results_[r.index];
    res.tokens.push_back(sampled[i]);
    r.next_token = sampled[i];
    if (sampled[i] == forward_->config().eos_token_id ||
        static_cast<int>(res.tokens.size()) == requests_[r.index].max_new_tokens) {
      r.done = true;
      res.finish_step = now_ + 1;
      memory_->release(std::move(r.cache), stored_tokens(r.index));
    }
  }
  // Free slots: at once (continuous), or when the whole batch is done (static, which hands
  // back every member's result at that moment).
  const bool all_done = std::all_of(running_.begin(), running_.end(), [](const auto& r) { return r->done; });
  if (scheduler_.policy() == Policy::Continuous || all_done) {
    if (scheduler_.policy() == Policy::Static)
      for (auto& r : running_) results_[r->index].finish_step = now_ + 1;
    std::erase_if(running_, [](const auto& r) { return r->done; });
  }
  for (const auto& r : running_)
    if (r->cache) entry.stored_tokens += r->cache->length();
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
