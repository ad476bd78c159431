"""PyTorch peers of the fused retrieval pipeline's scoring + top-K, on the same model shape.

Eager and torch.compile score every ad of the pool (fp16 embeddings, fp32 accumulation through
the matmul), mask the ineligible ones (a precomputed ~30% eligibility mask: PyTorch has no index
matching of its own here), route top-2 of 8 experts, softmax, add the bias and take torch.topk.
Also times torch.topk alone. Usage: python3 torch_peer.py [N] [K]
"""
import statistics
import sys

import torch


def timed(fn, repeats=5, warmup=2):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(times)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000_000
    k = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    d, experts, routing = 128, 8, 2
    torch.manual_seed(0)
    ads = torch.randn(n, d, device="cuda", dtype=torch.float16).mul_(d ** -0.5)
    bias = torch.randn(n, device="cuda").mul_(0.1)
    eligible = torch.rand(n, device="cuda") < 0.3
    vectors = torch.randn(d, 2 * experts, device="cuda", dtype=torch.float16)

    def score_topk(ads, vectors, bias, eligible):
        both = (ads @ vectors).float()  # (N, 2E): expert scores and gate logits
        scores, logits = both[:, :experts], both[:, experts:]
        top_logits, chosen = logits.topk(routing, dim=1)
        weights = torch.softmax(top_logits, dim=1)
        score = (weights * scores.gather(1, chosen)).sum(1) + bias
        score = torch.where(eligible, score, torch.full_like(score, float("-inf")))
        return torch.topk(score, k)

    eligible_count = int(eligible.sum())
    print(f"# PyTorch {torch.__version__} on {torch.cuda.get_device_name()}, N = {n}, K = {k}, "
          f"eligible {eligible_count / n:.1%}")
    t = timed(lambda: score_topk(ads, vectors, bias, eligible))
    print(f"eager scoring + top-K: {t * 1e3:.2f} ms = {n / t * 1e-9:.3f} G pool ads/s, "
          f"{eligible_count / t * 1e-9:.3f} G eligible ads/s")
    compiled = torch.compile(score_topk)
    t = timed(lambda: compiled(ads, vectors, bias, eligible))
    print(f"torch.compile scoring + top-K: {t * 1e3:.2f} ms = {n / t * 1e-9:.3f} G pool ads/s, "
          f"{eligible_count / t * 1e-9:.3f} G eligible ads/s")
    del ads
    values = torch.randn(n, device="cuda")
    t = timed(lambda: torch.topk(values, k))
    print(f"torch.topk alone (N fp32, K = {k}): {t * 1e3:.2f} ms = {n / t * 1e-9:.1f} G elements/s, "
          f"{4 * n / t * 1e-12:.3f} TB/s read")


if __name__ == "__main__":
    main()
