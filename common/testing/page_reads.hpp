/// @file page_reads.hpp
/// @brief Counting how many times a call reads a stretch of memory from afar: how a test sees
/// that a batched product reads its weights once for every row of x, not once per few rows.
///
///     PageReadCounter reads(w.q.data(), w.q.size());  // counts from here...
///     linear_quantized_rows_into(x, w, y, 0, rows, false);
///     EXPECT_LE(reads.passes(), 1.25);                 // ...to here
///
/// The stretch's pages are made unreadable. A read of one faults; the fault makes that page
/// readable again and the oldest of the last `window` pages it opened unreadable again, so the
/// readable pages are a small working set (32 pages, 128 KB: a cache's worth) that follows the
/// reads. A scan of the stretch faults once on each page; a second scan, once the working set has
/// moved on, faults on each again; reads within the working set (four rows of W meeting every
/// row of x) are free. So faults / pages is how many times the code walked the stretch.
///
/// Page-sized, not cache-line-sized: code that reads a few rows at a time, each from its start to
/// its end, counts one pass; code that walks a thin column of every row, then the next column,
/// counts a pass per column, though the memory under it saw each byte once. Prefetch hints never
/// fault and are not counted. One counter at a time in a process; any thread's reads are counted.
#pragma once

#include <cstddef>

namespace infer::testing {

class PageReadCounter {
 public:
  /// Watches the whole pages inside [begin, begin + bytes) (throws infer::Error if there are
  /// none, or if another counter is alive).
  PageReadCounter(const void* begin, std::size_t bytes, int window = 32);
  /// Makes every watched page readable and writable again.
  ~PageReadCounter();
  PageReadCounter(const PageReadCounter&) = delete;
  PageReadCounter& operator=(const PageReadCounter&) = delete;

  /// Faults since construction: pages fetched into the working set.
  long faults() const;
  /// Whole pages watched.
  long pages() const;
  /// faults() / pages(): how many times the stretch was walked.
  double passes() const { return static_cast<double>(faults()) / static_cast<double>(pages()); }
};

}  // namespace infer::testing
