#!/usr/bin/env python3
"""T-Rex vs Hugging Face transformers on one exported checkpoint (docs/hf_check.md).

    python3 compare.py --model HF_DIR --record rec.safetensors [--record ...] [--record64 rec64.safetensors]
                       [--out result.json]

HF_DIR is a `trex export-hf --dialect transformers` directory; each record is what `trex record-forward` wrote
for the same directory (input ids, T-Rex's fp32 logits, per-layer hidden states, indexer and router selections).
transformers runs the same ids in fp32 on the CPU (eager attention, eager experts) twice:

1. natural: its own indexer / router selections. Reported: logits and hidden-state errors, loss, greedy
   agreement, how many selections differ from T-Rex's, and at the first one (layer, position) the margin of
   transformers' own choice there. Not a pass criterion by itself: one near-tie flip moves everything downstream.
2. injected: T-Rex's selections forced into transformers' indexer and router. Both now compute the same
   function, so what remains is fp32 rounding. PASS needs
   - logits and every hidden state max|d| / max|ref| < ACT_TOL (1e-4, the golden fixtures' bound), loss |d| <
     LOSS_TOL (1e-5);
   - every selection where T-Rex's choice differs from the one transformers would make on its own (injected-run)
     scores to be a tie within rounding: the gap between transformers' preferred candidate and T-Rex's pick,
     over max(|transformers' k-th best score|, 1e-3) (make_fixture.py's margin), below TIE_TOL.
   - loading: no missing or unexpected tensor (mtp.* is ignored by transformers by design).
With --record64 (`trex record-forward --fp64`), transformers also runs in float64 (its norms, RoPE and mHC
still round through fp32) and is compared with T-Rex's fp64 run under the same criteria.
Prints one JSON object (also written to --out); exit status 1 when a criterion fails.
"""
import argparse
import json
import math
import sys

import torch
from safetensors.torch import load_file

ACT_TOL = 1e-4
LOSS_TOL = 1e-5
TIE_TOL = 1e-5


def max_rel(a, ref):
    a, ref = a.double(), ref.double()
    m = ref.abs().max().item()
    d = (a - ref).abs().max().item()
    return d / m if m > 0 else d


def load_model(model_dir, dtype):
    from transformers import DeepseekV4ForCausalLM

    model, info = DeepseekV4ForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="eager",
                                                        output_loading_info=True)
    model.set_experts_implementation("eager")
    model.eval()
    problems = {}
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        got = info.get(key) if isinstance(info, dict) else getattr(info, key, None)
        vals = [str(v) for v in (got or [])]
        vals = [v for v in vals if not v.startswith("mtp.") and ".mtp." not in v]
        if vals:
            problems[key] = vals[:20]
    return model, problems


class Probe:
    """Hooks on one transformers model: records layer inputs, the final normed output, indexer scores and
    selections, router scores and selections; optionally forces given selections."""

    def __init__(self, model):
        self.model = model
        self.inject = None  # {"indexer": {layer: LongTensor [B,S,k]}, "router": {layer: LongTensor [N,K]}}
        self.handles = []
        m = model.model
        self.layers = list(m.layers)
        self.ratio_csa = model.config.compress_rates["compressed_sparse_attention"]
        for i, layer in enumerate(self.layers):
            self.handles.append(layer.register_forward_pre_hook(self._layer_in(i), with_kwargs=True))
            comp = layer.self_attn.compressor
            if comp is not None and hasattr(comp, "indexer"):
                self.handles.append(comp.indexer.scorer.register_forward_hook(self._scores(i)))
                self.handles.append(comp.indexer.register_forward_hook(self._indexer(i)))
            gate = layer.mlp.gate
            if not layer.mlp.is_hash:
                self.handles.append(gate.register_forward_hook(self._router(i)))
        self.handles.append(m.norm.register_forward_hook(self._final))
        self.reset()

    def reset(self):
        self.layer_in, self.final = {}, None
        self.idx_scores, self.idx_sel, self.rt_scores, self.rt_sel = {}, {}, {}, {}

    def _layer_in(self, i):
        def hook(mod, args, kwargs):
            hs = args[0] if args else kwargs["hidden_states"]
            self.layer_in[i] = hs.detach().clone()
        return hook

    def _final(self, mod, inp, out):
        self.final = out.detach().clone()

    def _scores(self, i):
        def hook(mod, inp, out):
            self.idx_scores[i] = out.detach().clone()  # [B, S, T], before the causal mask
        return hook

    def _indexer(self, i):
        def hook(mod, inp, out):
            self.idx_sel[i] = out.detach().clone()
            if self.inject is not None and i in self.inject["indexer"]:
                forced = self.inject["indexer"][i].to(out.device)
                k = out.shape[-1]
                # transformers keeps min(index_topk, entries) slots; T-Rex keeps index_topk with -1 padding
                assert (forced[..., k:] < 0).all(), f"layer {i}: injected selection has more than {k} entries"
                return forced[..., :k].contiguous()
            return out
        return hook

    def _router(self, i):
        def hook(mod, inp, out):
            logits, weights, indices = out
            scores = mod.score_fn(logits)
            self.rt_scores[i] = (scores + mod.e_score_correction_bias).detach().clone()
            self.rt_sel[i] = indices.detach().clone()
            if self.inject is not None and i in self.inject["router"]:
                forced = self.inject["router"][i].to(indices.device).long()
                w = scores.gather(1, forced)
                w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
                return logits, w * mod.routed_scaling_factor, forced
            return out
        return hook

    def run(self, ids):
        self.reset()
        with torch.no_grad():
            out = self.model(input_ids=ids, labels=ids, use_cache=False)
        return out


def rel_gap(best, chosen):
    """(best - chosen) / max(|best|, 1e-3): the margin definition of make_fixture.py."""
    return (best - chosen) / max(abs(best), 1e-3)


def indexer_ties(scores, trex_sel, ratio, k):
    """Queries where T-Rex's selected set differs from transformers' top-k of `scores` (transformers' own scores
    of the same states). Returns (n_queries, n_differ, worst relative gap, where)."""
    B, S, T = scores.shape
    t_idx = torch.arange(S)
    visible = (t_idx + 1) // ratio  # entries 0 .. visible-1
    n, n_diff, worst, where = 0, 0, 0.0, None
    for b in range(B):
        for t in range(S):
            nv = int(visible[t])
            if nv == 0:
                continue
            n += 1
            s = scores[b, t, :nv].double()
            kk = min(k, nv)
            ours = sorted(int(e) for e in trex_sel[b, t].tolist() if e >= 0)
            theirs = sorted(torch.topk(s, kk).indices.tolist())
            if ours == theirs:
                continue
            n_diff += 1
            # transformers' k-th best score vs the worst score among T-Rex's picks
            kth = torch.topk(s, kk).values[-1].item()
            worst_ours = min(s[e].item() for e in ours) if ours else -math.inf
            gap = rel_gap(kth, worst_ours)
            if gap > worst:
                worst, where = gap, {"row": b, "pos": t, "kth_score": kth, "trex_worst_score": worst_ours}
    return n, n_diff, worst, where


def router_ties(scores, trex_sel, S):
    """Tokens where T-Rex's experts differ from transformers' top-K of its biased scores."""
    N, E = scores.shape
    K = trex_sel.shape[-1]
    n_diff, worst, where = 0, 0.0, None
    top = torch.topk(scores.double(), K, dim=-1)
    for i in range(N):
        ours = sorted(trex_sel[i].tolist())
        theirs = sorted(top.indices[i].tolist())
        if ours == theirs:
            continue
        n_diff += 1
        s = scores[i].double()
        kth = top.values[i, -1].item()
        worst_ours = min(s[e].item() for e in ours)
        gap = rel_gap(kth, worst_ours)
        if gap > worst:
            worst, where = gap, {"row": i // S, "pos": i % S, "kth_score": kth, "trex_worst_score": worst_ours}
    return N, n_diff, worst, where


def margins_at(scores, k):
    """Gap between the k-th and (k+1)-th score of each row of `scores` (last dim) over max(|k-th|, 1e-3), as
    make_fixture.py measures it; inf where a row has no more than k finite scores."""
    s = scores.double()
    finite = torch.isfinite(s).sum(-1)
    if s.shape[-1] <= k:
        return torch.full(s.shape[:-1], math.inf, dtype=torch.float64)
    top = torch.topk(torch.where(torch.isfinite(s), s, torch.full_like(s, -1e300)), k + 1, -1).values
    gap = (top[..., k - 1] - top[..., k]) / top[..., k - 1].abs().clamp_min(1e-3)
    return torch.where(finite > k, gap, torch.full_like(gap, math.inf))


def compare_states(probe, rec, L):
    hid = []
    for i in range(L):
        hid.append(max_rel(rec[f"hidden_states.{i}"], probe.layer_in[i]))
    hid.append(max_rel(rec[f"hidden_states.{L}"], probe.final))
    return hid


def first_parting(a, ref, tol):
    """First position (over rows) where max|a - ref| at that position exceeds tol * max|ref| (None: nowhere)."""
    a, ref = a.double(), ref.double()
    B, S = ref.shape[0], ref.shape[1]
    d = (a - ref).abs().reshape(B, S, -1).amax(-1).amax(0) / ref.abs().max().clamp_min(1e-300)
    idx = (d > tol).nonzero()
    return int(idx[0]) if len(idx) else None


def first_flip(probe, rec, L, S, k_idx):
    """The first selection (in layer order, then position) where T-Rex and transformers' natural run differ, with
    the margin of transformers' own choice there (k-th vs (k+1)-th score over max(|k-th|, 1e-3))."""
    for i in range(L):
        if i in probe.idx_sel:
            ours = rec[f"indexer_topk.{i}"]
            theirs = probe.idx_sel[i]
            ratio = probe.ratio_csa
            sc = probe.idx_scores[i].clone()
            T = sc.shape[-1]
            vis = (torch.arange(S) + 1) // ratio
            sc = sc.masked_fill(torch.arange(T).view(1, 1, -1) >= vis.view(1, -1, 1), -math.inf)
            marg = margins_at(sc, k_idx)
            for t in range(S):
                for b in range(ours.shape[0]):
                    a = sorted(e for e in ours[b, t].tolist() if e >= 0)
                    h = sorted(e for e in theirs[b, t].tolist() if e >= 0)
                    if a != h:
                        return {"layer": i, "kind": "indexer", "row": b, "pos": t, "trex": a, "hf": h,
                                "hf_rel_margin": marg[b, t].item(),
                                "trex_rel_margin": margins_at(rec[f"indexer_scores.{i}"], k_idx)[b, t].item()}
        if i in probe.rt_sel:
            ours = rec[f"router_topk.{i}"].reshape(-1, rec[f"router_topk.{i}"].shape[-1])
            theirs = probe.rt_sel[i]
            K = ours.shape[-1]
            marg = margins_at(probe.rt_scores[i], K)
            for t in range(S):
                for b in range(ours.shape[0] // S):
                    n = b * S + t
                    if sorted(ours[n].tolist()) != sorted(theirs[n].tolist()):
                        return {"layer": i, "kind": "router", "row": b, "pos": t, "trex": sorted(ours[n].tolist()),
                                "hf": sorted(theirs[n].tolist()), "hf_rel_margin": marg[n].item()}
    return None


def count_flips(probe, rec, L):
    out = {}
    for i in range(L):
        if i in probe.idx_sel:
            a = rec[f"indexer_topk.{i}"]
            h = probe.idx_sel[i]
            n = sum(sorted(x for x in a[b, t].tolist() if x >= 0) != sorted(x for x in h[b, t].tolist() if x >= 0)
                    for b in range(a.shape[0]) for t in range(a.shape[1]))
            out[f"indexer.{i}"] = n
        if i in probe.rt_sel:
            a = rec[f"router_topk.{i}"].reshape(probe.rt_sel[i].shape)
            out[f"router.{i}"] = int((a.sort(-1).values != probe.rt_sel[i].sort(-1).values).any(-1).sum())
    return out


def check_record(model, probe, rec, dtype, label):
    cfg = model.config
    L = cfg.num_hidden_layers
    ids = rec["input_ids"].long()
    B, S = ids.shape
    res = {"record": label, "batch": B, "seq": S, "dtype": str(dtype).replace("torch.", "")}

    # 1. natural
    probe.inject = None
    out = probe.run(ids)
    logits = out.logits.to(torch.float64)
    res["natural"] = {
        "loss_hf": out.loss.item(), "loss_trex": rec["loss"].item(),
        "loss_abs_diff": abs(out.loss.item() - rec["loss"].item()),
        "logits_max_rel_err": max_rel(rec["logits"], logits),
        "hidden_max_rel_err_per_layer": compare_states(probe, rec, L),
        "greedy_agree": float((logits.argmax(-1) == rec["logits"].argmax(-1)).double().mean()),
        # where the two part: first position whose error exceeds ACT_TOL, per layer input, final state, logits
        "first_parting_pos": [first_parting(rec[f"hidden_states.{i}"], probe.layer_in[i], ACT_TOL) for i in range(L)]
        + [first_parting(rec[f"hidden_states.{L}"], probe.final, ACT_TOL), first_parting(rec["logits"], logits, ACT_TOL)],
        "selections_differing": count_flips(probe, rec, L),
        "first_flip": first_flip(probe, rec, L, S, cfg.index_topk),
    }
    # margins of transformers' own selections over the whole run (how close the nearest tie is)
    near = {}
    for i, sc in probe.idx_scores.items():
        vis = (torch.arange(S) + 1) // probe.ratio_csa
        m = sc.masked_fill(torch.arange(sc.shape[-1]).view(1, 1, -1) >= vis.view(1, -1, 1), -math.inf)
        g = margins_at(m, cfg.index_topk)
        near[f"indexer.{i}"] = g[torch.isfinite(g)].min().item() if torch.isfinite(g).any() else None
    for i, sc in probe.rt_scores.items():
        near[f"router.{i}"] = margins_at(sc, cfg.num_experts_per_tok).min().item()
    res["natural"]["smallest_rel_margin"] = near

    # 2. injected: T-Rex's selections forced in
    inj = {"indexer": {}, "router": {}}
    for i in range(L):
        if f"indexer_topk.{i}" in rec:
            inj["indexer"][i] = rec[f"indexer_topk.{i}"].long()
        if i in probe.rt_sel:
            inj["router"][i] = rec[f"router_topk.{i}"].reshape(B * S, -1).long()
    probe.inject = inj
    out = probe.run(ids)
    probe.inject = None
    logits = out.logits.to(torch.float64)
    hid = compare_states(probe, rec, L)
    ties = {}
    worst_tie = 0.0
    for i in range(L):
        if i in probe.idx_scores:
            n, nd, w, where = indexer_ties(probe.idx_scores[i], inj["indexer"][i], probe.ratio_csa, cfg.index_topk)
            ties[f"indexer.{i}"] = {"queries": n, "differ": nd, "worst_rel_gap": w, "where": where}
            worst_tie = max(worst_tie, w)
        if i in probe.rt_scores:
            n, nd, w, where = router_ties(probe.rt_scores[i], inj["router"][i], S)
            ties[f"router.{i}"] = {"tokens": n, "differ": nd, "worst_rel_gap": w, "where": where}
            worst_tie = max(worst_tie, w)
    res["injected"] = {
        "loss_hf": out.loss.item(),
        "loss_abs_diff": abs(out.loss.item() - rec["loss"].item()),
        "logits_max_rel_err": max_rel(rec["logits"], logits),
        "hidden_max_rel_err_per_layer": hid,
        "greedy_agree": float((logits.argmax(-1) == rec["logits"].argmax(-1)).double().mean()),
        "ties": ties,
        "worst_tie_rel_gap": worst_tie,
    }
    inj_res = res["injected"]
    res["pass"] = bool(inj_res["logits_max_rel_err"] < ACT_TOL and max(hid) < ACT_TOL
                       and inj_res["loss_abs_diff"] < LOSS_TOL and worst_tie < TIE_TOL)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="trex export-hf directory (transformers dialect)")
    ap.add_argument("--record", action="append", required=True, help="trex record-forward output (fp32)")
    ap.add_argument("--record64", action="append", default=[], help="trex record-forward --fp64 output")
    ap.add_argument("--out", help="write the JSON result here too")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.set_float32_matmul_precision("highest")
    import transformers

    result = {"transformers": transformers.__version__, "torch": torch.__version__,
              "tolerances": {"act": ACT_TOL, "loss": LOSS_TOL, "tie": TIE_TOL}, "records": []}
    ok = True
    for dtype, recs in ((torch.float32, a.record), (torch.float64, a.record64)):
        if not recs:
            continue
        model, problems = load_model(a.model, dtype)
        if problems:
            result.setdefault("load_problems", {})[str(dtype)] = problems
            ok = False
        probe = Probe(model)
        rot = model.model.rotary_emb
        result.setdefault("hf_rope_inv_freq", {t: getattr(rot, f"{t}_inv_freq").tolist() for t in rot.layer_types})
        for path in recs:
            rec = load_file(path)
            try:
                r = check_record(model, probe, rec, dtype, path)
            except Exception:
                import traceback
                r = {"record": path, "dtype": str(dtype), "pass": False, "error": traceback.format_exc()}
            result["records"].append(r)
            ok = ok and r["pass"]
    result["pass"] = ok
    text = json.dumps(result, indent=1, default=str)
    print(text)
    if a.out:
        with open(a.out + ".tmp", "w") as f:
            f.write(text + "\n")
        import os
        os.replace(a.out + ".tmp", a.out)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
