#include "parallel/pipeline_memory.h"

#include "core/error.h"

namespace trex::parallel {

void HostPipelineMemory::resize(int64_t elems) {
  if (elems == elems_) return;
  TREX_CHECK(free_.size() == all_.size(), "pipeline host memory: resized to {} elements while {} of {} boundary "
             "buffers are in use", elems, all_.size() - free_.size(), all_.size());
  free_.clear(), all_.clear();  // buffers of the old size
  elems_ = elems;
}

void* HostPipelineMemory::take(BoundaryRole) {
  TREX_CHECK(elems_ > 0, "pipeline host memory: a boundary buffer before the boundary size is known");
  if (free_.empty()) {
    all_.push_back(std::make_unique<float[]>(size_t(elems_)));
    return all_.back().get();
  }
  float* b = free_.back();
  free_.pop_back();
  return b;
}

void HostPipelineMemory::give(BoundaryRole, void* buf) {
  if (buf) free_.push_back(static_cast<float*>(buf));
}

}  // namespace trex::parallel
