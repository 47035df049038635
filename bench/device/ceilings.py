# Measures the two ceilings of the GPU it runs on (METHOD.md): device-to-device copy bandwidth (bytes read +
# written) and the dense bf16 matrix rate on random data, each as the median of timed repeats after warm-up.
import json, statistics, torch

def timed(fn, warmup=3, reps=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)

out = {"device": torch.cuda.get_device_name(0)}
n = 1 << 30  # 1 GiB of bytes per buffer
src = torch.randn(n // 4, device="cuda"); dst = torch.empty_like(src)
t = timed(lambda: dst.copy_(src))
out["copy_GBps"] = 2 * n / t / 1e9
for m in (4096, 8192):
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16); b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    t = timed(lambda: a @ b)
    out[f"bf16_gemm_{m}_TFLOPs"] = 2 * m**3 / t / 1e12
print(json.dumps(out))
