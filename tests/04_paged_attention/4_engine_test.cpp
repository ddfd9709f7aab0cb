// Lesson 04, part D: lesson 03's engine on the paged pool: admission by free blocks, and
// preemption by recompute when the pool runs dry.
#include <algorithm>
#include <set>

#include "common/rng.hpp"
#include "common/testing/graded.hpp"
#include "common/testing/models.hpp"
#include "common/testing/throws.hpp"
#include "common/tokenizer.hpp"
#include "common/weights.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"

namespace infer {
namespace {

std::vector<GenerationRequest> requests(int n, uint64_t seed, bool sampled) {
  Rng rng(seed);
  std::vector<GenerationRequest> reqs;
  int arrival = 0;
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    r.id = 700 + i;
    r.prompt = {1};
    for (int k = 2 + static_cast<int>(rng.below(14)); k > 0; --k) r.prompt.push_back(3 + static_cast<int>(rng.below(37)));
    r.max_new_tokens = 4 + static_cast<int>(rng.below(30));
    if (sampled) r.sampling = {.temperature = 0.8f, .top_p = 0.9f, .seed = 40u + i};
    else r.sampling = {.temperature = 0.0f};
    arrival += static_cast<int>(rng.below(2));
    r.arrival_step = arrival;
    reqs.push_back(r);
  }
  return reqs;
}

std::vector<GenerationResult> run(const ModelWeights& m, const std::vector<GenerationRequest>& reqs, int max_batch,
                                  std::unique_ptr<KVManager> memory, std::vector<EngineStepLog>* log = nullptr) {
  Engine engine(m, Policy::Continuous, max_batch, std::move(memory));
  for (const auto& r : reqs) engine.submit(r);
  auto results = engine.run();
  if (log) *log = engine.log();
  const auto& paged = dynamic_cast<const PagedKVManager&>(engine.memory());
  EXPECT_EQ(paged.pool().allocator().num_free(), paged.pool().num_blocks())
      << "every block is back in the pool once every request has finished";
  return results;
}

std::vector<GenerationResult> unpressured(const ModelWeights& m, const std::vector<GenerationRequest>& reqs) {
  Engine engine(m, Policy::Continuous, 4);  // lesson 03's whole-context slots
  for (const auto& r : reqs) engine.submit(r);
  return engine.run();
}

/// lesson 03's CPU runner, watching a pool: how many blocks each forward took.
class WatchingRunner final : public ModelRunner {
 public:
  WatchingRunner(const ModelWeights& m, const KVBlockPool& pool) : cpu_(m), pool_(pool) {}
  const ModelConfig& config() const override { return cpu_.config(); }
  Matrix forward(const StepInput& step) override {
    const int before = pool_.allocator().num_free();
    Matrix out = cpu_.forward(step);
    taken += before - pool_.allocator().num_free();
    return out;
  }
  int taken = 0;  ///< blocks taken inside forwards, over the run

 private:
  CpuRunner cpu_;
  const KVBlockPool& pool_;
};

GRADED_TEST(Lesson04Engine, TheForwardTakesNoBlockTheStepDidNotReserve, 2) {
  // The engine reserves every sequence's positions while it plans a step (KVStore::reserve); the
  // forward then only writes. A pool tight enough to preempt, greedy and sampled requests.
  const ModelWeights& m = testing::small_model();
  const auto reqs = requests(12, 17, true);
  auto memory = std::make_unique<PagedKVManager>(m.config, 12, 4);
  const KVBlockPool& pool = memory->pool();
  auto runner = std::make_unique<WatchingRunner>(m, pool);
  WatchingRunner& watch = *runner;
  Engine engine(std::move(runner), std::move(memory), {.max_running = 6});
  for (const auto& r : reqs) engine.submit(r);
  const auto got = engine.run();
  EXPECT_EQ(watch.taken, 0) << "the forwards took " << watch.taken
                            << " blocks: reserve() must take every block a step's positions need (and copy any "
                               "shared one) before the forward appends";
  const auto want = unpressured(m, reqs);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << want[i].id;
  int preempted = 0;
  for (const auto& r : got) preempted += r.preemptions;
  EXPECT_GT(preempted, 0) << "the pool was meant to be tight enough to preempt";
}

GRADED_TEST(Lesson04Engine, OpenAdmitsOnlyWhatTheFreeBlocksHold, 2) {
  const ModelConfig& c = testing::small_model().config;
  PagedKVManager memory(c, 4, 4);
  auto a = memory.open(9);  // 3 blocks
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(memory.reserved_tokens(), 12) << "open(9) reserves 3 blocks of 4";
  EXPECT_EQ(a->length(), 0) << "open() reserves; the prefill stores";
  EXPECT_EQ(memory.open(5), nullptr) << "5 positions need 2 blocks; 1 is free";
  auto b = memory.open(4);
  ASSERT_NE(b, nullptr) << "4 positions fit in the last free block";
  EXPECT_EQ(memory.reserved_tokens(), 16);
  memory.close(std::move(a));
  memory.close(std::move(b));
  EXPECT_EQ(memory.reserved_tokens(), 0);
  EXPECT_EQ(memory.pool().allocator().num_free(), 4);
  EXPECT_TRUE(testing::throws_error_mentioning([&] { memory.open(17); }, "17"))
      << "17 positions can never fit in a pool of 16";
}

GRADED_TEST(Lesson04Engine, PreemptsTheNewestUntilTheOthersFit, 3) {
  const ModelConfig& c = testing::small_model().config;
  PagedKVManager memory(c, 6, 2);
  auto grow = [&](KVStore& s, int n) {
    for (int l = 0; l < c.num_hidden_layers; ++l) s.append(l, Matrix::Ones(n, 16), Matrix::Ones(n, 16));
  };
  auto a = memory.open(2), b = memory.open(3), d = memory.open(4);  // 1 + 2 + 2 blocks: 1 free
  grow(*a, 2), grow(*b, 3), grow(*d, 4);
  std::vector<const KVStore*> running = {a.get(), b.get(), d.get()};
  // a and d have full last blocks (need 1 each), b has room: demand 2 > 1 free.
  EXPECT_EQ(memory.preemptions_needed(running), 1) << "preempting the newest (2 blocks) leaves 3 free for a's 1";
  running = {a.get(), b.get()};
  EXPECT_EQ(memory.preemptions_needed(running), 0) << "a needs 1 block and 1 is free";
  grow(*a, 1);  // a takes the last free block; now a has room, b has room
  running = {a.get(), b.get(), d.get()};
  EXPECT_EQ(memory.preemptions_needed(running), 1) << "d needs a block, none is free: d itself must go";
  auto e = dynamic_cast<PagedKVCache&>(*b).fork();  // b's 2 blocks are now shared
  running = {a.get(), d.get(), b.get()};
  EXPECT_EQ(memory.preemptions_needed(running), 2)
      << "b's next write copies its shared last block, d needs one; preempting b frees nothing (shared), so d goes too";
}

GRADED_TEST(Lesson04Engine, ASharedLastBlockNeedsACopyUntilItsCoHolderIsPreempted, 2) {
  // a holds 6 positions in blocks of 4 (the second block half full); c is its fork, sharing both.
  // Each one's next write lands in the shared second block, so each needs a free block to copy
  // it into. Preempting c drops its hold on the blocks: a's second block is then its own, and a
  // writes into it in place.
  const ModelConfig& c = testing::small_model().config;
  for (const int num_blocks : {4, 3, 2}) {
    PagedKVManager memory(c, num_blocks, 4);
    auto a = memory.open(6);
    ASSERT_NE(a, nullptr);
    for (int l = 0; l < c.num_hidden_layers; ++l) a->append(l, Matrix::Ones(6, 16), Matrix::Ones(6, 16));
    auto fork = dynamic_cast<PagedKVCache&>(*a).fork();
    const std::vector<const KVStore*> running = {a.get(), fork.get()};
    const int free_blocks = num_blocks - 2;
    const int want = free_blocks >= 2 ? 0 : 1;
    EXPECT_EQ(memory.preemptions_needed(running), want)
        << num_blocks << " blocks (" << free_blocks << " free), a and its fork sharing a half-full last block: "
        << (want == 0 ? "each copies the shared block into a free one"
                      : "preempting the fork leaves a's last block unshared, so a needs no copy");
  }
}

GRADED_TEST(Lesson04Engine, PreemptionCountsWhatTheVictimsFreeTogether, 2) {
  const ModelConfig& c = testing::small_model().config;
  auto grow = [&](KVStore& s, int n) {
    for (int l = 0; l < c.num_hidden_layers; ++l) s.append(l, Matrix::Ones(n, 16), Matrix::Ones(n, 16));
  };
  {
    // A store just opened for an 8-token prompt in a block of 16: its table is ahead of its
    // length, and its next position (0) lies in a block it holds alone. It needs nothing.
    PagedKVManager memory(c, 1, 16);
    auto a = memory.open(8);
    ASSERT_NE(a, nullptr);
    const std::vector<const KVStore*> running = {a.get()};
    EXPECT_EQ(memory.preemptions_needed(running), 0)
        << "a store opened for 8 positions in its one block of 16, nothing written yet: position 0 lies in its own "
           "block, so it needs no free block (a block is needed when the next position lies past the table, not "
           "whenever it starts a block)";
  }
  {
    // fill and a hold a block each; b holds 2 positions in a block c (its fork) shares. No free
    // block. fill's next position opens a block; b's and c's fall in their shared block.
    // Preempting c frees nothing (b still holds the block) but leaves it b's alone; preempting b
    // as well frees it: 2 preemptions, and fill's block fits.
    PagedKVManager memory(c, 3, 4);
    auto fill = memory.open(4), a = memory.open(2), b = memory.open(2);
    grow(*fill, 4), grow(*a, 2), grow(*b, 2);
    auto fork = dynamic_cast<PagedKVCache&>(*b).fork();
    const std::vector<const KVStore*> running = {fill.get(), a.get(), b.get(), fork.get()};
    EXPECT_EQ(memory.preemptions_needed(running), 2)
        << "b and its fork share a block: preempting both frees it (holds are dropped by every victim together, "
           "not judged one victim at a time), and fill's next block fits; a need not go";
  }
  {
    // a holds 8 positions in 2 full blocks, c (its fork) shares both; 1 free block. Each needs
    // a new block. Preempting c frees nothing, and then only a's need counts: it fits.
    PagedKVManager memory(c, 3, 4);
    auto a = memory.open(8);
    grow(*a, 8);
    auto fork = dynamic_cast<PagedKVCache&>(*a).fork();
    const std::vector<const KVStore*> running = {a.get(), fork.get()};
    EXPECT_EQ(memory.preemptions_needed(running), 1)
        << "with the fork preempted, only a's next block is needed, and one is free (a preempted sequence needs "
           "nothing any more)";
  }
  {
    PagedKVManager memory(c, 4, 4), other(c, 4, 4);
    auto a = memory.open(2), stranger = other.open(2);
    KVCache flat(c, 16);
    const std::vector<const KVStore*> unpaged = {a.get(), &flat}, foreign = {a.get(), stranger.get()};
    EXPECT_TRUE(testing::throws_error_mentioning([&] { memory.preemptions_needed(unpaged); }, ""))
        << "a store that is not paged: refused, not skipped";
    EXPECT_TRUE(testing::throws_error_mentioning([&] { memory.preemptions_needed(foreign); }, ""))
        << "a store of another pool: refused, not counted against this one";
  }
}

GRADED_TEST(Lesson04Engine, WithRoomToSpareThePagedEngineEqualsTheSlotEngine, 2) {
  const auto reqs = requests(30, 3, false);
  std::vector<EngineStepLog> log;
  const auto got = run(testing::small_model(), reqs, 4, std::make_unique<PagedKVManager>(testing::small_model().config, 64, 16), &log);
  const auto want = unpressured(testing::small_model(), reqs);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << reqs[i].id;
    EXPECT_EQ(got[i].first_token_step, want[i].first_token_step) << "request " << reqs[i].id;
    EXPECT_EQ(got[i].preemptions, 0);
  }
}

GRADED_TEST(Lesson04Engine, UnderPressureEveryRequestCompletesOnceWithIdenticalOutput, 4) {
  // 12 blocks of 4 = 48 positions for up to 8 sequences of up to 48: the pool runs dry again
  // and again; preempted sequences are recomputed and carry on exactly where they stopped,
  // sampled ones included (each keeps its sampler).
  for (const bool sampled : {false, true}) {
    const auto reqs = requests(40, 17, sampled);
    std::vector<EngineStepLog> log;
    const auto got = run(testing::small_model(), reqs, 8, std::make_unique<PagedKVManager>(testing::small_model().config, 12, 4), &log);
    const auto want = unpressured(testing::small_model(), reqs);
    ASSERT_EQ(got.size(), reqs.size()) << "every request gets exactly one result";
    std::set<int> ids;
    int preemptions = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_TRUE(ids.insert(got[i].id).second) << "request " << got[i].id << " came back twice";
      EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << reqs[i].id << " (preempted " << got[i].preemptions
                                               << " times, " << (sampled ? "sampled" : "greedy") << ")";
      preemptions += got[i].preemptions;
    }
    EXPECT_GT(preemptions, 0) << "the pool was meant to run dry: nothing was preempted";
  }
}

GRADED_TEST(Lesson04Engine, TheSameBytesHoldMoreSequencesThanWholeContextSlots, 2) {
  // Two whole-context slots of 64 positions = 128 positions = 32 blocks of 4: paged, the same
  // memory runs several times as many sequences at once.
  const auto reqs = requests(40, 5, false);
  std::vector<EngineStepLog> log;
  run(testing::small_model(), reqs, 16, std::make_unique<PagedKVManager>(testing::small_model().config, 32, 4), &log);
  int most = 0;
  for (const auto& e : log) most = std::max(most, e.decodes + e.prefills);
  EXPECT_GE(most, 6) << "sequences running at once in the memory of 2 whole-context slots";
}

}  // namespace
}  // namespace infer
