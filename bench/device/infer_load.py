#!/usr/bin/env python3
"""Load test of a running `trex serve` (OpenAI-compatible, ids-only) with the standard library only.

For each concurrency level C: C simultaneous streaming requests of P random prompt ids and max_tokens 1 (prefill
round: prefill tokens/s = C * P / wall time), then C simultaneous streaming requests generating G tokens each
(greedy, ignore_eos) for time to first token (TTFT), inter-token latency (ITL) and decode tokens/s.
ITL: the gap between consecutive streamed chunks, spread evenly over the tokens of the later chunk (the server may
put several tokens in one chunk). Decode tokens/s: tokens after each request's first, summed, over the time from
the last first token to the last token (the span where every request is decoding).
After each level the server's /health must report no active or queued request within 10 s (no leaked slots), and
with --pid the server's resident memory is read before and after every level (host memory flat under load).
Prints a human line and one JSON line ("LOAD {...}") per level.
    python3 infer_load.py --port 8123 --prompt 512 --gen 64 --levels 1,16,64 [--pid SERVER_PID]
"""
import argparse, http.client, json, random, statistics, sys, threading, time


def request(port, model, prompt, max_tokens, out):
    t0 = time.perf_counter()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        body = json.dumps({"model": model, "prompt_token_ids": prompt, "max_tokens": max_tokens, "temperature": 0,
                           "ignore_eos": True, "stream": True})
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            out["error"] = f"HTTP {r.status}: {r.read()[:300]!r}"
            return
        chunks = []  # (arrival time, tokens in the chunk)
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                break
            j = json.loads(data)
            if "error" in j:
                out["error"] = str(j["error"])
                break
            for ch in j.get("choices", []):
                n = len((ch.get("delta", {}).get("content") or "").split())
                if n:
                    chunks.append((time.perf_counter(), n))
        conn.close()
        out.update(t0=t0, chunks=chunks, t_end=time.perf_counter())
    except Exception as e:  # report, never hang the run
        out["error"] = f"{type(e).__name__}: {e}"


def run_round(port, model, C, P, G, vocab, rng):
    prompts = [[rng.randrange(2, vocab) for _ in range(P)] for _ in range(C)]
    outs = [dict() for _ in range(C)]
    th = [threading.Thread(target=request, args=(port, model, prompts[i], G, outs[i])) for i in range(C)]
    t = time.perf_counter()
    for x in th:
        x.start()
    for x in th:
        x.join()
    return outs, time.perf_counter() - t


def health(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("GET", "/health")
    return json.loads(c.getresponse().read())


def drained(port, wait_s=10.0):
    """True once /health reports no active and no queued request (the slots of finished requests are freed)."""
    deadline = time.time() + wait_s
    h = {}
    while time.time() < deadline:
        try:
            h = health(port)
            if h.get("active") == 0 and h.get("queued") == 0:
                return True, h
        except Exception as e:  # report, never hang the run
            h = {"error": str(e)}
        time.sleep(0.2)
    return False, h


def rss_mib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def pct(v, q):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--levels", default="1,16,64")
    ap.add_argument("--vocab", type=int, default=129280)
    ap.add_argument("--wait", type=float, default=60)
    ap.add_argument("--pid", type=int, default=0, help="the server's pid: report its resident memory per level")
    a = ap.parse_args()
    rng = random.Random(0)
    deadline = time.time() + a.wait
    model = None
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", a.port, timeout=2)
            c.request("GET", "/v1/models")
            r = c.getresponse()
            if r.status == 200:
                model = json.loads(r.read())["data"][0]["id"]
                break
        except Exception:
            pass
        time.sleep(0.5)
    if model is None:
        print(f"FAIL load test: server on port {a.port} not up after {a.wait} s")
        return 1
    ok = True
    # Warm-up (cuBLASLt plans, memory pool): one short request.
    run_round(a.port, model, 2, 32, 4, a.vocab, rng)
    rss0 = rss_mib(a.pid) if a.pid else None
    for C in [int(x) for x in a.levels.split(",")]:
        rss_before = rss_mib(a.pid) if a.pid else None
        outs, wall_p = run_round(a.port, model, C, a.prompt, 1, a.vocab, rng)
        errs = [o["error"] for o in outs if "error" in o]
        outs2, wall_d = run_round(a.port, model, C, a.prompt, a.gen, a.vocab, rng)
        errs += [o["error"] for o in outs2 if "error" in o]
        if errs:
            ok = False
            print(f"FAIL load test C={C}: {len(errs)} errors, first: {errs[0]}")
            continue
        ttft = [(o["chunks"][0][0] - o["t0"]) * 1e3 for o in outs2 if o["chunks"]]
        itl = []
        ntok = 0
        for o in outs2:
            ch = o["chunks"]
            ntok += sum(n for _, n in ch)
            for (ta, _), (tb, n) in zip(ch, ch[1:]):
                itl += [(tb - ta) * 1e3 / n] * n
        first_last = max(o["chunks"][0][0] for o in outs2)
        end_last = max(o["chunks"][-1][0] for o in outs2)
        dec_tokens = ntok - C
        # a chunk may carry several tokens: count the first request's extra first-chunk tokens as decoded too
        dec_tps = dec_tokens / (end_last - first_last) if end_last > first_last else float("nan")
        res = {"concurrency": C, "prompt_tokens": a.prompt, "gen_tokens": a.gen,
               "prefill_tok_s": round(C * a.prompt / wall_p, 1), "prefill_round_s": round(wall_p, 3),
               "decode_tok_s": round(dec_tps, 1), "decode_round_s": round(wall_d, 3),
               "completion_tokens": ntok, "expected_tokens": C * a.gen,
               "ttft_ms_p50": round(pct(ttft, 50), 1), "ttft_ms_p90": round(pct(ttft, 90), 1),
               "ttft_ms_p99": round(pct(ttft, 99), 1),
               "itl_ms_p50": round(pct(itl, 50), 2), "itl_ms_p90": round(pct(itl, 90), 2),
               "itl_ms_p99": round(pct(itl, 99), 2)}
        free, h = drained(a.port)
        res["slots_freed"] = free
        if not free:
            ok = False
            print(f"FAIL load test C={C}: the server still reports {h} 10 s after the last request finished")
        if a.pid:
            res["server_rss_mib_before"], res["server_rss_mib_after"] = rss_before, rss_mib(a.pid)
        if ntok != C * a.gen:
            ok = False
            print(f"FAIL load test C={C}: {ntok} tokens streamed, expected {C * a.gen}")
        print(f"C={C:3d}: prefill {res['prefill_tok_s']:.0f} tok/s ({C}x{a.prompt} prompt tokens in {wall_p:.2f} s); "
              f"decode {res['decode_tok_s']:.0f} tok/s; TTFT p50/p90/p99 {res['ttft_ms_p50']}/{res['ttft_ms_p90']}/"
              f"{res['ttft_ms_p99']} ms; ITL p50/p90/p99 {res['itl_ms_p50']}/{res['itl_ms_p90']}/{res['itl_ms_p99']} ms; "
              f"slots freed {free}" + (f"; server RSS {rss_before} -> {res['server_rss_mib_after']} MiB" if a.pid else ""))
        print("LOAD " + json.dumps(res))
        sys.stdout.flush()
    if a.pid:
        print(f"server RSS over the whole test: {rss0} -> {rss_mib(a.pid)} MiB")
    print("PASS load test (no errors, every token streamed, every slot freed)" if ok else "FAIL load test")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
