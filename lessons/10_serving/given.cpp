// Lesson 10: the plumbing given to students (the engine's queue, memory and bookkeeping),
// compiled with your exercises/ and with the reference.
#include "lessons/10_serving/serving.hpp"

namespace infer {

// ------------------------------------------------------------------ engine --

ServingEngine::ServingEngine(const ModelWeights& model, ServingOptions options)
    : ServingEngine(std::make_unique<CpuRunner>(model),
                    std::make_unique<SlotKVManager>(model.config, std::max(1, options.max_running)), options) {}

ServingEngine::ServingEngine(std::unique_ptr<ModelRunner> forward, std::unique_ptr<KVManager> memory,
                             ServingOptions options)
    : forward_(std::move(forward)),
      memory_(std::move(memory)),
      options_(options),
      queue_(Policy::Continuous, std::max(1, options.max_running)) {
  require(forward_ != nullptr, "ServingEngine: no forward backend");
  require(memory_ != nullptr, "ServingEngine: no KV memory");
  require(options_.max_running >= 1, "ServingEngine: max_running must be >= 1, got ", options_.max_running);
  require(options_.token_budget >= options_.max_running, "ServingEngine: token_budget (", options_.token_budget,
          ") must be >= max_running (", options_.max_running, "), so that every decode fits in a step");
  current_.step = 0;
}

ServingEngine::~ServingEngine() = default;

void ServingEngine::submit(GenerationRequest r) {
  const ModelConfig& c = forward_->config();
  check_tokens(c, r.prompt, "ServingEngine::submit");
  r.sampling.validate();
  require(r.max_new_tokens >= 1, "ServingEngine::submit: request ", r.id, " asks for ", r.max_new_tokens,
          " new tokens, expected >= 1");
  const size_t need = r.prompt.size() + static_cast<size_t>(r.max_new_tokens);
  require(need <= static_cast<size_t>(c.max_position_embeddings), "ServingEngine::submit: request ", r.id,
          ": prompt of ", r.prompt.size(), " tokens + max_new_tokens ", r.max_new_tokens, " exceeds the context of ",
          c.max_position_embeddings, " positions");
  require(need <= static_cast<size_t>(memory_->capacity_tokens()), "ServingEngine::submit: request ", r.id,
          ": prompt of ", r.prompt.size(), " tokens + max_new_tokens ", r.max_new_tokens, " exceeds the ",
          memory_->capacity_tokens(), " positions the KV memory can give one sequence");
  require(!index_of_.contains(r.id), "ServingEngine::submit: request id ", r.id, " was already submitted");
  if (!requests_.empty())  // (require() evaluates its message's parts even when the check passes)
    require(r.arrival_step >= requests_.back().arrival_step, "ServingEngine::submit: request ", r.id,
            " arrives at step ", r.arrival_step, ", before the previous request (", requests_.back().arrival_step,
            "): submit in arrival order");
  queue_.add(static_cast<int>(requests_.size()), r.arrival_step);
  index_of_.emplace(r.id, requests_.size());
  cancelled_.push_back(0);
  results_.push_back({r.id, {}, r.arrival_step, 0, 0, 0, 0});
  requests_.push_back(std::move(r));
  paused_.emplace_back();
}

bool ServingEngine::cancel(int id) {
  const auto it = index_of_.find(id);
  require(it != index_of_.end(), "ServingEngine::cancel: request id ", id, " was never submitted");
  const size_t index = it->second;
  if (cancelled_[index] || results_[index].finish_step > 0) return false;
  cancelled_[index] = 1;
  results_[index].finish_step = now_;
  const auto seq = std::find_if(running_.begin(), running_.end(), [&](const auto& s) { return s->index == index; });
  if (seq != running_.end()) {
    memory_->close(std::move((*seq)->cache));
    running_.erase(seq);
  } else {
    paused_[index].reset();  // waiting (perhaps preempted): admit_next() will skip it
    ++cancelled_waiting_;
  }
  return true;
}

std::vector<int> ServingEngine::history(size_t index) const {
  std::vector<int> tokens = requests_[index].prompt;
  tokens.insert(tokens.end(), results_[index].tokens.begin(), results_[index].tokens.end());
  return tokens;
}

int ServingEngine::make_room() {
  std::vector<const KVStore*> stores;
  for (const auto& s : running_)
    if (!s->done) stores.push_back(s->cache.get());
  const int victims = memory_->make_room(stores);
  require(victims >= 0 && victims <= static_cast<int>(stores.size()), "ServingEngine: the KV memory asks to preempt ",
          victims, " of ", stores.size(), " running sequences");
  for (int n = 0; n < victims; ++n) {
    auto newest = std::find_if(running_.rbegin(), running_.rend(), [](const auto& s) { return !s->done; });
    std::unique_ptr<Sequence> victim = std::move(*newest);
    running_.erase(std::next(newest).base());
    const size_t index = victim->index;
    memory_->close(std::move(victim->cache));  // not release(): what it frees must stay free
    ++results_[index].preemptions;
    queue_.push_front(static_cast<int>(index), requests_[index].arrival_step);
    // One that has sampled keeps its sampler and its next token, to resume; one preempted in the
    // middle of its prompt has sampled nothing, and will start over as new.
    if (!results_[index].tokens.empty()) paused_[index] = std::move(victim);
  }
  current_.preempted += victims;
  return victims;
}

ServingEngine::Sequence* ServingEngine::admit_next() {
  size_t index = 0;
  for (;;) {
    const std::vector<int> ids = queue_.admit(now_, static_cast<int>(running_.size()));
    if (ids.empty()) return nullptr;
    index = static_cast<size_t>(ids.front());
    for (size_t b = ids.size(); b-- > 1;) queue_.push_front(ids[b], requests_[ids[b]].arrival_step);
    if (!cancelled_[index]) break;
    --cancelled_waiting_;  // withdrawn while it waited: drop it
  }
  std::vector<int> tokens = history(index);
  const bool resumed = paused_[index] != nullptr;
  if (resumed) tokens.pop_back();  // its last token is fed by its next decode
  std::unique_ptr<KVStore> cache = memory_->open_for(tokens);
  if (!cache) {
    if (running_.empty())
      throw Error(cat("ServingEngine: the KV memory cannot hold request ", requests_[index].id, "'s ", tokens.size(),
                      " positions even with nothing else running"));
    queue_.push_front(static_cast<int>(index), requests_[index].arrival_step);
    return nullptr;
  }
  // This step's decodes come first: a newcomer may not take the memory one of them needs for
  // its next position (make_room() made sure it was there).
  std::vector<const KVStore*> others;
  for (const auto& s : running_)
    if (!s->done) others.push_back(s->cache.get());
  if (!others.empty() && memory_->make_room(others) > 0) {
    memory_->close(std::move(cache));
    queue_.push_front(static_cast<int>(index), requests_[index].arrival_step);
    return nullptr;
  }
  if (resumed) {
    running_.push_back(std::move(paused_[index]));
    running_.back()->cache = std::move(cache);
    running_.back()->prefill = std::move(tokens);
    running_.back()->resumed = true;
  } else {
    if (results_[index].preemptions == 0) results_[index].cached_tokens = cache->length();  // at its first start
    running_.push_back(std::make_unique<Sequence>(
        Sequence{index, Sampler(requests_[index].sampling), std::move(cache), std::move(tokens), false, 0, false}));
  }
  ++current_.admitted;
  return running_.back().get();
}

void ServingEngine::emit(Sequence& seq, int token) {
  require(!seq.done, "ServingEngine::emit: request ", requests_[seq.index].id, " has already finished");
  GenerationResult& res = results_[seq.index];
  if (res.tokens.empty()) res.first_token_step = now_;
  res.tokens.push_back(token);
  seq.next_token = token;
  seq.resumed = false;
  if (token == forward_->config().eos_token_id ||
      static_cast<int>(res.tokens.size()) == requests_[seq.index].max_new_tokens)
    seq.done = true;
}

void ServingEngine::end_step(std::span<const Planned> plan, bool forwarded) {
  for (const Planned& p : plan) {
    if (p.decode) {
      ++current_.decodes;
    } else {
      ++current_.prefill_chunks;
      current_.prefill_tokens += p.tokens;
    }
  }
  current_.forwards = forwarded ? 1 : 0;
  for (auto& s : running_)
    if (s->done) {
      results_[s->index].finish_step = now_ + 1;
      memory_->release(std::move(s->cache), history(s->index));
    }
  std::erase_if(running_, [](const auto& s) { return s->done; });
  current_.running = static_cast<int>(running_.size());
  current_.step = now_;
  log_.push_back(current_);
  current_ = ServingStepLog{};
  ++now_;
}

std::vector<GenerationResult> ServingEngine::run() {
  while (step()) {
  }
  return results_;
}

}  // namespace infer
