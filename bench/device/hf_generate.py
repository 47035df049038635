#!/usr/bin/env python3
"""Reference decoding throughput: Hugging Face transformers' DeepSeek-V4 `generate` (bf16, random weights, greedy)
on the same config as the trex server, built like ../shared/bench/hf_baseline.py builds its model.
    python3 hf_generate.py CONFIG.json --batch 16 --prompt 512 --gen 64
Times generate(max_new_tokens=1) (prefill + one token) and generate(max_new_tokens=G); decode tokens/s =
B * (G - 1) / (t_G - t_1). Prints one JSON line ("HF {...}").
"""
import argparse, json, os, sys, time
import torch

ap = argparse.ArgumentParser()
ap.add_argument("config")
ap.add_argument("--batch", type=int, default=16)
ap.add_argument("--prompt", type=int, default=512)
ap.add_argument("--gen", type=int, default=64)
ap.add_argument("--flops-dir", default=".devdeps")
a = ap.parse_args()
sys.path.insert(0, a.flops_dir)
from model_flops import load
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

cfg = load(a.config)
hf = dict(cfg)
rs = hf.pop("rope_scaling", None)
if rs:
    hf["rope_parameters"] = {"rope_type": rs.get("type", "yarn"), **{k: v for k, v in rs.items() if k != "type"}}
config = DeepseekV4Config(**hf)
torch.manual_seed(0)
t = time.perf_counter()
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = DeepseekV4ForCausalLM(config)
model.eval()
try:
    model.set_experts_implementation("grouped_mm")
except Exception as e:
    print(f"note: grouped_mm experts unavailable ({e})")
build_s = time.perf_counter() - t
ids = torch.randint(2, config.vocab_size, (a.batch, a.prompt), device="cuda")
mask = torch.ones_like(ids)


def gen(n):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=0)
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out.shape[1] - ids.shape[1]


gen(2)  # warm-up
t1, n1 = gen(1)
tg, ng = gen(a.gen)
res = {"impl": "transformers generate", "batch": a.batch, "prompt_tokens": a.prompt, "gen_tokens": ng,
       "model_build_s": round(build_s, 1), "prefill_plus_1_s": round(t1, 3), "generate_s": round(tg, 3),
       "prefill_tok_s": round(a.batch * a.prompt / t1, 1),
       "decode_tok_s": round(a.batch * (ng - 1) / (tg - t1), 1) if tg > t1 else None,
       "end_to_end_tok_s": round(a.batch * ng / tg, 1),
       "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)}
print("HF " + json.dumps(res))
