#!/usr/bin/env python3
"""The peers of kevo's KernelBench-format problems on a GPU: PyTorch eager and torch.compile, timed by kevo's own
helper (include/kevo/eval/harness/kevo_torch.py: fresh inputs, L2 flushed, CUDA events), with the family kevo's
trace matches, beside a device-to-device copy of 1 GiB as the memory roofline measured in the same run.

  python3 benchmarks/kernelbench/peers.py problems/kernelbench --device cuda --json peers.json

Each problem's figures are printed as they come (a line a problem), so a run cut short keeps what it measured."""
import argparse
import importlib.util
import json
import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("kevo_torch", os.path.join(here, "..", "..", "include", "kevo", "eval", "harness", "kevo_torch.py"))
kevo_torch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kevo_torch)


def copy_roofline(device):
    import torch

    n = 1 << 28  # 1 GiB of float32
    x = torch.randn(n, device=device)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        start.record()
        y.copy_(x)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    times.sort()
    return 2 * 4 * n / times[len(times) // 2] / 1e9  # read + write, GB/s


def main():
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--repetitions", type=int, default=10)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_grad_enabled(False)
    roof = copy_roofline(args.device)
    print(f"device {torch.cuda.get_device_name()}, PyTorch {torch.__version__}; a 1 GiB copy moves {roof:.0f} GB/s (read + write)", flush=True)
    rows = []
    for name in sorted(f for f in os.listdir(args.dir) if f.endswith(".py")):
        path = os.path.join(args.dir, name)
        row = {"problem": name}
        try:
            module, _ = kevo_torch.load_module(path, args.scale)
            model, inputs = kevo_torch.instantiate(module, 1, args.device)
            state = kevo_torch.state_tensors(model)
            out = kevo_torch.outputs_of(model(*inputs))
            row["family"] = kevo_torch.match_family(model, inputs, state, out[0]) if len(out) == 1 else None
            moved = sum(t.numel() * t.element_size() for t in inputs + [t for _, t in state] + out)
            sets = [kevo_torch.instantiate(module, 1000 * (k + 1), args.device)[1] for k in range(3)]
            row["eager_ms"] = 1e3 * kevo_torch.time_calls(model, sets, args.device, 2, args.repetitions)
            t0 = time.time()
            torch._dynamo.reset()
            compiled = torch.compile(model)
            row["compile_ms"] = 1e3 * kevo_torch.time_calls(compiled, sets, args.device, 3, args.repetitions)
            row["compile_build_s"] = time.time() - t0
            row["bytes"] = moved
            row["eager_roofline"] = moved / (row["eager_ms"] / 1e3) / 1e9 / roof
            row["compile_roofline"] = moved / (row["compile_ms"] / 1e3) / 1e9 / roof
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        rows.append(row)
        fam = row.get("family") or {}
        print(f"{name:28} {str(fam.get('family', '-')) + ' ' + str(fam.get('op', fam.get('kind', ''))):24} "
              f"eager {row.get('eager_ms', 0):8.3f} ms ({100 * row.get('eager_roofline', 0):3.0f}% of the copy)  "
              f"compile {row.get('compile_ms', 0):8.3f} ms ({100 * row.get('compile_roofline', 0):3.0f}%)  {row.get('error', '')}", flush=True)
        del module
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_gbytes_per_s": roof, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
