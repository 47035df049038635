// A CUPTI activity tracer loaded into any CUDA program through CUDA_INJECTION64_PATH (no change to the program):
// it records every kernel, copy, memset and runtime-API call with CUPTI's timestamps (one clock for the host and
// the device) and writes them at exit as tab-separated lines to $TREX_TRACE_OUT (default kernel_trace.tsv):
//   kind  start_ns  end_ns  stream  correlation  name
// kind is K (kernel), C (copy; name = copy kind and bytes), S (memset) or A (runtime API call; stream -1).
// analyze.py reads it: where the device sits idle between kernels, and which host call it waits for.
// Built only by dev/trace/device.sh; never linked into the product.
#include <cupti.h>
#include <cxxabi.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#ifndef TRACE_KERNEL_RECORD
#error "define TRACE_KERNEL_RECORD / TRACE_MEMCPY_RECORD / TRACE_MEMSET_RECORD (device.sh reads them off cupti_activity.h)"
#endif

namespace {

struct Row {
  char kind;
  uint64_t start, end;
  int64_t stream;
  uint32_t corr;
  std::string name;
};

std::mutex g_mu;
std::vector<Row> g_rows;
std::atomic<bool> g_done{false};

constexpr size_t kBufferBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

std::string demangle(const char* n) {
  if (!n) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(n, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : n;
  std::free(d);
  // Template arguments make names unreadable: keep the function's name and the first 60 characters of the rest.
  if (s.size() > 140) s = s.substr(0, 140);
  for (char& c : s)
    if (c == '\t' || c == '\n') c = ' ';
  return s;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::vector<Row> rows;
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    switch (rec->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        auto* k = reinterpret_cast<const TRACE_KERNEL_RECORD*>(rec);
        rows.push_back({'K', k->start, k->end, int64_t(k->streamId), k->correlationId, demangle(k->name)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        auto* m = reinterpret_cast<const TRACE_MEMCPY_RECORD*>(rec);
        char n[96];
        std::snprintf(n, sizeof n, "copy kind %u %llu B", unsigned(m->copyKind), (unsigned long long)m->bytes);
        rows.push_back({'C', m->start, m->end, int64_t(m->streamId), m->correlationId, n});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        auto* m = reinterpret_cast<const TRACE_MEMSET_RECORD*>(rec);
        char n[64];
        std::snprintf(n, sizeof n, "memset %llu B", (unsigned long long)m->bytes);
        rows.push_back({'S', m->start, m->end, int64_t(m->streamId), m->correlationId, n});
        break;
      }
      case CUPTI_ACTIVITY_KIND_RUNTIME: {
        auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
        const char* n = nullptr;
        cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &n);
        rows.push_back({'A', a->start, a->end, -1, a->correlationId, n ? n : "?"});
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(g_mu);
  g_rows.insert(g_rows.end(), std::make_move_iterator(rows.begin()), std::make_move_iterator(rows.end()));
}

void write_out() {
  if (g_done.exchange(true)) return;
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  const char* path = std::getenv("TREX_TRACE_OUT");
  const std::string out = path && *path ? path : "kernel_trace.tsv";
  const std::string tmp = out + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "kernel_trace: cannot write %s\n", tmp.c_str());
    return;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  for (const Row& r : g_rows)
    std::fprintf(f, "%c\t%llu\t%llu\t%lld\t%u\t%s\n", r.kind, (unsigned long long)r.start, (unsigned long long)r.end,
                 (long long)r.stream, r.corr, r.name.c_str());
  std::fclose(f);
  std::rename(tmp.c_str(), out.c_str());
  std::fprintf(stderr, "kernel_trace: %zu records -> %s\n", g_rows.size(), out.c_str());
}

bool check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  std::fprintf(stderr, "kernel_trace: %s failed: %s\n", what, s ? s : "?");
  return false;
}

}  // namespace

extern "C" int InitializeInjection(void) {
  if (!check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register callbacks")) return 0;
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernels");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable copies");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enable memsets");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "enable runtime API");
  std::atexit(write_out);
  return 1;
}
