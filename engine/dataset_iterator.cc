// Dataset as a range: begin(), end(), and what dereferencing an iterator gives: get() of its
// position, checked against [0, size()) (get() alone would take -1 as the last record).
#include "dataset_impl.h"
#include "mmtensor/error.h"

namespace mmt {
namespace {

Sample sample_at(const Dataset* dataset, int64_t position) {
  MMT_CHECK(dataset != nullptr, ValueError, "Dataset::iterator: dereferenced a default-constructed iterator");
  const int64_t records = dataset->size();
  MMT_CHECK(position >= 0 && position < records, IndexError, "Dataset::iterator: dereferenced at position ",
            position, " of a dataset of ", records, " records (valid: ",
            records > 0 ? detail::str("0..", records - 1) : std::string("none"), "; end() is past the last one)");
  return dataset->get(position);
}

}  // namespace

Dataset::iterator Dataset::begin() const {
  (void)size();  // an empty handle throws here, as end() does
  return iterator(this, 0);
}

Dataset::iterator Dataset::end() const { return iterator(this, size()); }

Sample Dataset::iterator::operator*() const { return sample_at(dataset_, index_); }

Sample Dataset::iterator::operator[](difference_type n) const { return sample_at(dataset_, index_ + n); }

}  // namespace mmt
