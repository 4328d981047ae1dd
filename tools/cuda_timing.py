"""CUDA-event timing of a PyTorch call, shared by tools/bench_sdpa.py and
tools/bench_prefill_attn.py (both import it from beside themselves)."""
import statistics


def median_ms(fn, iters, warmup=5):
    """Median milliseconds of `iters` calls of fn(), each between two CUDA
    events on the current stream, after `warmup` calls and a synchronize."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)
