#include "model/dsv4/weights.h"

#include <algorithm>

namespace trex::dsv4 {

template <class T>
void ParamTable<T>::declare(const std::string& name, const Shape& shape, bool lm_grad) {
  TREX_CHECK(!allocated(), "parameter table: '{}' declared after allocation", name);
  TREX_CHECK(index_.count(name) == 0, "parameter table: '{}' declared twice", name);
  ParamInfo p;
  p.name = name;
  p.shape = shape;
  p.numel = trex::numel(shape);
  p.offset = total_;
  p.lm_grad = lm_grad;
  const int64_t align = int64_t(64 / sizeof(T));
  total_ += (p.numel + align - 1) / align * align;
  index_[name] = entries_.size();
  entries_.push_back(std::move(p));
}

template <class T>
void ParamTable<T>::allocate() {
  values_.assign(size_t(std::max<int64_t>(total_, 1)), T(0));
  grads_.assign(size_t(std::max<int64_t>(total_, 1)), T(0));
}

template <class T>
const ParamInfo& ParamTable<T>::info(const std::string& name) const {
  auto it = index_.find(name);
  TREX_CHECK(it != index_.end(), "parameter table has no tensor named '{}'", name);
  return entries_[it->second];
}

template <class T>
int64_t ParamTable<T>::n_params() const {
  int64_t n = 0;
  for (const auto& e : entries_) n += e.numel;
  return n;
}

template <class T>
void ParamTable<T>::zero_grads() {
  std::fill(grads_.begin(), grads_.end(), T(0));
}

template class ParamTable<float>;
template class ParamTable<double>;

}  // namespace trex::dsv4
