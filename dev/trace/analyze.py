#!/usr/bin/env python3
"""Where a traced CUDA program's device time goes (kernel_trace.cpp's tab-separated records).

The window is the timed loop of `trex bench train`: from the end of the last cudaMemPoolSetAttribute call (the
bench resets the pool's high-water mark right before its timed steps) to the end of the last
cudaDeviceSynchronize, or the whole trace when there is no such call. Within it:
  - busy: the union of kernel / copy / memset intervals over every stream; idle = window - busy;
  - the idle gaps longer than --gap-us, each with the kernel before and after it and the host calls that were
    running during it (a host wait on the device shows up as a synchronous copy or synchronize in flight);
  - idle summed by the host call in flight and by the kernel after the gap;
  - device time by kernel name (summed durations; streams overlap, so this can exceed busy).
Usage: analyze.py TRACE.tsv [--steps N] [--gap-us 5] [--top 30]
"""
import argparse
import bisect
import collections


def load(path):
    dev, api = [], []
    with open(path) as f:
        for line in f:
            p = line.rstrip("\n").split("\t", 5)
            if len(p) < 6:
                continue
            kind, s, e, stream, corr, name = p[0], int(p[1]), int(p[2]), int(p[3]), int(p[4]), p[5]
            (api if kind == "A" else dev).append((s, e, kind, stream, corr, name))
    dev.sort()
    api.sort()
    return dev, api


def window(dev, api):
    marks = [a for a in api if a[5].startswith("cudaMemPoolSetAttribute")]
    syncs = [a for a in api if a[5].startswith("cudaDeviceSynchronize")]
    lo = marks[-1][1] if marks else dev[0][0]
    hi = syncs[-1][1] if syncs and syncs[-1][1] > lo else dev[-1][1]
    return lo, hi


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=1, help="timed steps in the window (per-step numbers)")
    ap.add_argument("--gap-us", type=float, default=5.0)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    dev, api = load(a.trace)
    lo, hi = window(dev, api)
    span = hi - lo
    ops = [d for d in dev if d[1] > lo and d[0] < hi]
    per = 1e6 * a.steps  # ns -> ms per step

    # Union of device intervals, and the gaps between them.
    busy, gaps = 0, []
    cur_s, cur_e, prev = None, None, None
    for op in ops:
        s, e = max(op[0], lo), min(op[1], hi)
        if cur_e is None:
            if s > lo:
                gaps.append((s - lo, lo, s, None, op))
            cur_s, cur_e, prev = s, e, op
            continue
        if s > cur_e:
            busy += cur_e - cur_s
            gaps.append((s - cur_e, cur_e, s, prev, op))
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
        if e >= cur_e:
            prev = op
    if cur_e is not None:
        busy += cur_e - cur_s
        if hi > cur_e:
            gaps.append((hi - cur_e, cur_e, hi, prev, None))
    idle = span - busy
    print(f"window {span / per:.2f} ms per step ({a.steps} steps), device busy {busy / per:.2f} ms, "
          f"idle {idle / per:.2f} ms ({100 * idle / span:.1f}%), {len(ops)} device ops, "
          f"{sum(1 for o in ops if o[2] == 'K')} kernels")

    api_starts = [x[0] for x in api]

    def in_flight(g_s, g_e):
        """Host calls overlapping [g_s, g_e): the longest overlap first."""
        out = []
        i = bisect.bisect_left(api_starts, g_e)
        j = i - 1
        while j >= 0 and j > i - 400:
            s, e = api[j][0], api[j][1]
            ov = min(e, g_e) - max(s, g_s)
            if ov > 0:
                out.append((ov, api[j][5]))
            j -= 1
        out.sort(reverse=True)
        return out

    thr = a.gap_us * 1e3
    big = [g for g in gaps if g[0] >= thr]
    small = sum(g[0] for g in gaps if g[0] < thr)
    print(f"gaps >= {a.gap_us} us: {len(big) / a.steps:.0f} per step, {sum(g[0] for g in big) / per:.2f} ms; "
          f"shorter gaps {small / per:.2f} ms")
    hist = collections.Counter()
    for g in gaps:
        us = g[0] / 1e3
        b = "<2us" if us < 2 else "2-5" if us < 5 else "5-20" if us < 20 else "20-100" if us < 100 else \
            "100-1000" if us < 1000 else ">=1ms"
        hist[b] += g[0]
    print("idle by gap size, ms per step:", {k: round(v / per, 2) for k, v in sorted(hist.items())})

    by_call = collections.Counter()
    by_next = collections.Counter()
    by_pair = collections.Counter()
    for g in big:
        calls = in_flight(g[1], g[2])
        key = calls[0][1] if calls else "(no host call: the host was between calls)"
        by_call[key] += g[0]
        nxt = g[4][5][:70] if g[4] else "(end)"
        by_next[nxt] += g[0]
        pv = g[3][5][:50] if g[3] else "(start)"
        by_pair[(pv, nxt[:50])] += g[0]
    print(f"\nidle (gaps >= {a.gap_us} us) by the host call most in flight, ms per step:")
    for k, v in by_call.most_common(a.top):
        print(f"  {v / per:8.2f}  {k}")
    print("\nidle by the device op after the gap, ms per step:")
    for k, v in by_next.most_common(a.top):
        print(f"  {v / per:8.2f}  {k}")
    print("\nidle by (op before, op after), ms per step:")
    for k, v in by_pair.most_common(a.top):
        print(f"  {v / per:8.2f}  {k[0]}  ->  {k[1]}")
    print(f"\nlongest gaps (us): before -> after [host calls in flight]")
    for g in sorted(big, reverse=True)[: a.top]:
        calls = ", ".join(f"{n} {ov / 1e3:.0f}us" for ov, n in in_flight(g[1], g[2])[:3])
        pv = g[3][5][:45] if g[3] else "(start)"
        nx = g[4][5][:45] if g[4] else "(end)"
        print(f"  {g[0] / 1e3:9.1f}  {pv} -> {nx} [{calls}]")

    dur = collections.Counter()
    cnt = collections.Counter()
    for o in ops:
        nm = o[5][:90] if o[2] == "K" else o[5].split(" ")[0] + " " + o[5].split(" ")[1] if o[2] == "C" else o[5][:6]
        dur[nm] += o[1] - o[0]
        cnt[nm] += 1
    print("\ndevice time by op, ms per step (calls per step):")
    for k, v in dur.most_common(a.top + 10):
        print(f"  {v / per:8.2f}  ({cnt[k] / a.steps:6.0f})  {k}")
    api_t = collections.Counter()
    api_n = collections.Counter()
    for x in api:
        if x[1] > lo and x[0] < hi:
            api_t[x[5]] += min(x[1], hi) - max(x[0], lo)
            api_n[x[5]] += 1
    print("\nhost time inside runtime calls, ms per step (calls per step):")
    for k, v in api_t.most_common(15):
        print(f"  {v / per:8.2f}  ({api_n[k] / a.steps:6.0f})  {k}")


if __name__ == "__main__":
    main()
