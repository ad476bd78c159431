# The peers a user would pick instead of a searched kernel, timed as kevo's checker times (CUDA
# events over calls on distinct inputs after an L2 flush), beside a streaming-read roofline
# measured in the same run. Prints one line per peer: ms per call and GB/s.
import torch

def timed(fn, inputs, repeat=5):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    best = []
    for _ in range(repeat):
        flush.zero_()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for x in inputs:
            fn(x)
        stop.record()
        torch.cuda.synchronize()
        best.append(start.elapsed_time(stop) / len(inputs))
    best.sort()
    return best[len(best) // 2]

torch.manual_seed(0)
src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
dst = torch.empty_like(src)
ms = timed(lambda t: dst.copy_(t), [src], repeat=7)
print(f"roofline (device copy of 1 GiB, read + write): {2 * src.numel() / ms / 1e6:.1f} GB/s")

R, C = 16384, 4096
xs = [torch.randn(R, C, device="cuda") * 3 for _ in range(4)]
for name, fn in [("torch.softmax", lambda x: torch.softmax(x, dim=1)),
                 ("torch.compile(softmax)", torch.compile(lambda x: torch.softmax(x, dim=1)))]:
    fn(xs[0])
    ms = timed(fn, xs)
    print(f"{name} {R}x{C} fp32: {ms:.4f} ms, {8 * R * C / ms / 1e6:.1f} GB/s")

x = [torch.randn(R, C, device="cuda") for _ in range(4)]
w, b = torch.randn(C, device="cuda"), torch.randn(C, device="cuda")
for name, fn in [("torch.nn.functional.layer_norm", lambda t: torch.nn.functional.layer_norm(t, (C,), w, b, 1e-5))]:
    fn(x[0])
    ms = timed(fn, x)
    print(f"{name} {R}x{C} fp32: {ms:.4f} ms, {8 * R * C / ms / 1e6:.1f} GB/s")

n = 4096
a = [torch.randn(n, n, device="cuda", dtype=torch.half) for _ in range(2)]
bm = torch.randn(n, n, device="cuda", dtype=torch.half)
ms = timed(lambda t: torch.matmul(t, bm).float(), a)
print(f"torch.matmul fp16 {n}^3 (fp32 out): {ms:.4f} ms, {2 * n ** 3 / ms / 1e9:.1f} TFLOP/s")

v = [torch.randn(50_000_000, device="cuda") for _ in range(2)]
ms = timed(lambda t: torch.topk(t, 1000), v)
print(f"torch.topk 50M, K=1000: {ms:.4f} ms, {50e6 / ms / 1e6:.1f} G elements/s")
