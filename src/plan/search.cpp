#include "plan/search.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "core/progress.h"

namespace trex::plan {

namespace {
// The device memory a search leaves free when it trades full recomputation for selective layer by layer.
constexpr double kRecomputeHeadroom = 0.05;
}  // namespace

namespace {
std::vector<int64_t> powers_of_two_upto(int64_t n) {
  std::vector<int64_t> v;
  for (int64_t x = 1; x <= n; x *= 2) v.push_back(x);
  return v;
}
}  // namespace

SearchResult search_layouts(const Estimator& est, int64_t devices, size_t keep, bool progress,
                            const std::function<bool(const Layout&)>& accept) {
  const ModelSpec& m = est.math().spec();
  const HardwareProfile& hw = est.hardware();
  const Workload& w = est.workload();
  std::vector<Layout> candidates;
  int64_t rejected = 0;  // by accept
  const int64_t blocks = est.math().n_blocks(w.mtp);
  for (int64_t tp : powers_of_two_upto(std::min<int64_t>(hw.devices_per_node, 8)))
    for (int64_t pp = 1; pp <= std::min<int64_t>(devices, 16); ++pp) {
      if (devices % (tp * pp) != 0) continue;
      for (int64_t vpp : {1, 2, 4})
        for (int64_t cp : {1, 2, 4}) {
          if (cp > 1 && w.seq < 16384) continue;  // context parallelism only pays at long sequences
          for (int64_t ep : powers_of_two_upto(std::min<int64_t>(devices, m.n_routed_experts)))
            for (int64_t etp : tp > 1 ? std::vector<int64_t>{1, tp} : std::vector<int64_t>{1}) {
              for (int64_t mbs : {1, 2, 4})
                for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full})
                  for (Offload off : {Offload::None, Offload::Swap}) {
                    Layout l;
                    l.tp = tp, l.pp = pp, l.vpp = vpp, l.cp = cp, l.ep = ep, l.etp = etp, l.mbs = mbs;
                    l.recompute = rc, l.offload = off, l.zero = 1, l.overlap = true;
                    if (pp * vpp > blocks) continue;
                    if (accept && !accept(l)) {
                      ++rejected;
                      continue;
                    }
                    candidates.push_back(l);
                  }
            }
        }
    }
  SearchResult res;
  res.considered = res.refused = rejected;
  std::unique_ptr<ProgressBar> bar;
  if (progress) bar = std::make_unique<ProgressBar>("plan search", int64_t(candidates.size()), "layouts");
  std::vector<Estimate> fitting;
  for (size_t i = 0; i < candidates.size(); ++i) {
    Estimate e = est.estimate(candidates[i], devices);
    // ZeRO-1 is the faster level where it fits (no transient gradient buffers); where it does not, the same
    // layout with the dense gradients sharded (ZERO=2: the same DP traffic, less memory) takes its place, and
    // where that does not fit either, the dense weights sharded too (ZERO=3: gathered per layer, more traffic).
    if (e.valid && !e.fits && candidates[i].zero == 1 && candidates[i].offload == Offload::None) {
      for (int level : {2, 3}) {
        Layout z = candidates[i];
        z.zero = level;
        if (accept && !accept(z)) continue;
        Estimate ez = est.estimate(z, devices);
        if (ez.valid && ez.fits) {
          e = std::move(ez);
          break;
        }
      }
    }
    // Full recomputation where it fits: replay as few layers in full as still fit (the others recompute
    // selectively: faster, larger), at the layout's ZeRO level and with the dense gradients sharded (ZERO=2 frees
    // their memory for selective layers at the same DP traffic). Memory falls as the full layers grow, so the fewest
    // is a binary search; it keeps kRecomputeHeadroom of the device free, the planner's memory error bar, since
    // packing layers up to the last GiB would turn a few percent of misprediction into an allocation failure.
    if (e.valid && e.fits && e.layout.recompute == Recompute::Full && e.layout.rc_full_layers < 0) {
      std::vector<int> levels{e.layout.zero};
      if (e.layout.zero < 2 && e.layout.offload == Offload::None) levels.push_back(2);
      std::optional<Estimate> best;
      for (int level : levels) {
        int64_t lo = 0, hi = m.n_layers + 1;  // the answer lies in [lo, hi]; hi: none found
        std::optional<Estimate> found;
        while (lo < hi) {
          const int64_t mid = (lo + hi) / 2;
          Layout k = e.layout;
          k.zero = level, k.rc_full_layers = mid;
          Estimate ek = est.estimate(k, devices);
          if (ek.valid && ek.fits && ek.mem.total <= (1.0 - kRecomputeHeadroom) * ek.mem.capacity &&
              (!accept || accept(k))) {
            hi = mid, found = std::move(ek);
          } else {
            lo = mid + 1;
          }
        }
        if (found && (!best || found->tokens_per_s > best->tokens_per_s)) best = std::move(found);
      }
      if (best && best->tokens_per_s > e.tokens_per_s) e = std::move(*best);
    }
    ++res.considered;
    if (!e.valid) ++res.refused;
    else if (!e.fits) ++res.out_of_memory;
    else fitting.push_back(std::move(e));
    if (bar && (i % 256 == 0 || i + 1 == candidates.size())) bar->update(int64_t(i + 1));
  }
  if (bar) bar->finish(fmt::format("{} fit, {} refused, {} out of memory", fitting.size(), res.refused,
                                   res.out_of_memory));
  std::sort(fitting.begin(), fitting.end(), [](const Estimate& a, const Estimate& b) {
    if (a.mfu != b.mfu) return a.mfu > b.mfu;
    return a.mem.total < b.mem.total;
  });
  if (fitting.size() > keep) fitting.resize(keep);
  res.best = std::move(fitting);
  return res;
}

std::string estimates_table(const std::vector<Estimate>& rows) {
  std::string s = fmt::format("{:<44} {:>6} {:>6} {:>9} {:>8} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7}\n", "layout",
                              "MFU%", "6N%", "tok/s/dev", "step s", "compute", "recomp", "comm", "bubble", "optim",
                              "mem GiB", "cap");
  for (const auto& e : rows) {
    if (!e.valid) {
      s += fmt::format("{:<44} refused: {}\n", to_string(e.layout), e.reason);
      continue;
    }
    s += fmt::format("{:<44} {:>6.2f} {:>6.2f} {:>9.0f} {:>8.2f} {:>8.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.1f} {:>7.1f}{}\n",
                     to_string(e.layout), 100 * e.mfu, 100 * e.mfu_6n, e.tokens_per_s_per_device, e.time.step,
                     e.time.compute, e.time.recompute, e.time.exposed_comm(), e.time.bubble, e.time.optimizer,
                     e.mem.total, e.mem.capacity, e.fits ? "" : "  OUT OF MEMORY");
  }
  return s;
}

nlohmann::json estimate_to_json(const Estimate& e) {
  nlohmann::json j = {{"layout", to_string(e.layout)}, {"valid", e.valid}, {"fits", e.fits}, {"reason", e.reason}};
  if (!e.valid) return j;
  j["micro_batches"] = e.micro_batches;
  j["stage_blocks"] = e.stage_blocks;
  j["tokens_per_step"] = e.tokens_per_step;
  j["tokens_per_s"] = e.tokens_per_s;
  j["tokens_per_s_per_device"] = e.tokens_per_s_per_device;
  j["flops_per_token"] = e.flops_per_token;
  j["six_n_flops_per_token"] = e.six_n_per_token;
  j["model_tflops_per_device"] = e.model_tflops_per_device;
  j["mfu"] = e.mfu;
  j["mfu_6n"] = e.mfu_6n;
  const auto& t = e.time;
  j["time_s"] = {{"step", t.step},   {"compute", t.compute}, {"recompute", t.recompute}, {"tp", t.tp},
                 {"ep", t.ep},       {"cp", t.cp},           {"pp", t.pp},               {"dp", t.dp},
                 {"bubble", t.bubble}, {"optimizer", t.optimizer}, {"overhead", t.overhead}};
  const auto& m = e.mem;
  j["memory_gib"] = {{"stage", m.stage},          {"weights", m.weights},     {"grads", m.grads},
                     {"optimizer", m.optimizer},  {"activations", m.activations}, {"logits", m.logits},
                     {"comm_buffers", m.comm_buffers}, {"workspace", m.workspace}, {"swap_buffers", m.swap_buffers}, {"fixed", m.fixed},
                     {"total", m.total},          {"capacity", m.capacity},   {"host", m.host_gib},
                     {"inflight_micro_batches", m.inflight}};
  return j;
}

std::string estimates_html(const std::vector<Estimate>& rows, const std::string& title) {
  // Two stacked bar charts as inline SVG: step time by component, memory by component.
  struct Part {
    const char* name;
    const char* color;
  };
  const Part tparts[] = {{"compute", "#4e79a7"}, {"recompute", "#a0cbe8"}, {"exposed comm", "#f28e2b"},
                         {"bubble", "#e15759"},  {"optimizer", "#76b7b2"}, {"overhead", "#bab0ac"}};
  const Part mparts[] = {{"weights", "#4e79a7"}, {"grads", "#59a14f"},  {"optimizer", "#76b7b2"},
                         {"activations", "#f28e2b"}, {"logits", "#edc948"}, {"buffers+fixed", "#bab0ac"}};
  std::vector<const Estimate*> ok;
  for (const auto& e : rows)
    if (e.valid) ok.push_back(&e);
  double tmax = 1e-9, mmax = 1e-9;
  for (auto* e : ok) tmax = std::max(tmax, e->time.step), mmax = std::max({mmax, e->mem.total, e->mem.capacity});
  const int row_h = 26, label_w = 330, bar_w = 520;
  auto chart = [&](bool time) {
    std::string svg = fmt::format("<svg width='{}' height='{}' font-family='monospace' font-size='11'>", label_w + bar_w + 120,
                                  row_h * (ok.size() + 2));
    int y = 0;
    for (auto* e : ok) {
      std::vector<double> v;
      if (time) {
        v = {e->time.compute - e->time.recompute, e->time.recompute, e->time.exposed_comm(), e->time.bubble,
             e->time.optimizer, e->time.overhead};
      } else {
        v = {e->mem.weights, e->mem.grads, e->mem.optimizer, e->mem.activations, e->mem.logits,
             e->mem.comm_buffers + e->mem.workspace + e->mem.swap_buffers + e->mem.fixed};
      }
      const double scale = bar_w / (time ? tmax : mmax);
      svg += fmt::format("<text x='0' y='{}'>{}</text>", y + 16, to_string(e->layout));
      double x = label_w;
      for (size_t i = 0; i < v.size(); ++i) {
        double w = std::max(0.0, v[i]) * scale;
        svg += fmt::format("<rect x='{:.1f}' y='{}' width='{:.1f}' height='18' fill='{}'><title>{}: {:.3f}</title></rect>",
                           x, y + 4, w, time ? tparts[i].color : mparts[i].color, time ? tparts[i].name : mparts[i].name,
                           v[i]);
        x += w;
      }
      if (!time)
        svg += fmt::format("<line x1='{:.1f}' x2='{:.1f}' y1='{}' y2='{}' stroke='black'/>", label_w + e->mem.capacity * scale,
                           label_w + e->mem.capacity * scale, y + 2, y + 24);
      svg += fmt::format("<text x='{:.1f}' y='{}'>{}</text>", x + 4, y + 16,
                         time ? fmt::format("{:.2f} s, MFU {:.1f}%", e->time.step, 100 * e->mfu)
                              : fmt::format("{:.1f} GiB", e->mem.total));
      y += row_h;
    }
    int lx = label_w;
    for (const auto& p : (time ? tparts : mparts)) {
      svg += fmt::format("<rect x='{}' y='{}' width='10' height='10' fill='{}'/><text x='{}' y='{}'>{}</text>", lx, y + 8,
                         p.color, lx + 13, y + 17, p.name);
      lx += 100;
    }
    return svg + "</svg>";
  };
  std::string html = "<!doctype html><html><head><meta charset='utf-8'><title>" + title +
                     "</title></head><body style='font-family:sans-serif'>";
  html += "<h2>" + title + "</h2><h3>Step time (s) by component</h3>" + chart(true);
  html += "<h3>Peak memory per rank (GiB); the black line is the usable capacity</h3>" + chart(false);
  html += "<h3>Table</h3><pre>" + estimates_table(rows) + "</pre></body></html>";
  return html;
}

}  // namespace trex::plan
