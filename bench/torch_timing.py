"""CUDA-event timing of a PyTorch callable, shared by the benchmarks that time PyTorch's side."""
import statistics

import torch


def time_ms(fn, reps=15):
    """The median over `reps` runs after two warm-ups, in milliseconds of device time."""
    fn()
    fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)
