"""A small CNN trained on the CPU, for the PyTorch end-to-end tests (tests/tests/python/pytorch.rs).

Usage:
    pytorch_train.py strobelight CALLS   PyTorch's strobelight decorator around train_step, called
                                         CALLS times; one JSON line per call on stdout
    pytorch_train.py compile             one step of a torch.compile'd model (run it with
                                         TORCH_COMPILE_STROBELIGHT=1 to profile each phase)
    pytorch_train.py loop SECONDS [READY] train for SECONDS of wall time (for bpfprof --pid),
                                         creating the file READY once training has begun

Everything runs on 2 threads (torch.set_num_threads(2)), batch 64 at 3x64x64, so that a step
takes about half a second on the CI machine's 2 cores.
"""

import json
import sys
import time

import torch

BATCH = 64
SIDE = 64
THREADS = 2


class SmallCNN(torch.nn.Module):
    """Two convolutions and a linear classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 16, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(16, 32, 3, padding=1),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def setup(model: torch.nn.Module):
    torch.manual_seed(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(BATCH, 3, SIDE, SIDE)
    target = torch.randint(0, 10, (BATCH,))
    return optimizer, data, target


def train_step(model, optimizer, data, target) -> float:
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()
    return loss.item()


def strobelight_calls(calls: int) -> None:
    from torch._strobelight.cli_function_profiler import (
        StrobelightCLIFunctionProfiler,
        strobelight,
    )

    # Stop to results: PyTorch's own stop (stopRun) and collection (getRunStatus) calls.
    timings = []
    stop_and_collect = StrobelightCLIFunctionProfiler._stop_strobelight_no_throw

    def timed(self, collect_results: bool) -> None:
        started = time.monotonic()
        stop_and_collect(self, collect_results)
        # A stop without collection is the clean-up of a run that failed to start.
        if collect_results:
            timings.append(time.monotonic() - started)

    StrobelightCLIFunctionProfiler._stop_strobelight_no_throw = timed
    profiler = StrobelightCLIFunctionProfiler(sample_tags=["pytorch-e2e"])
    model = SmallCNN()
    optimizer, data, target = setup(model)
    train_step(model, optimizer, data, target)  # warm-up: first-call allocations

    @strobelight(profiler)
    def profiled(model, optimizer, data, target) -> float:
        return train_step(model, optimizer, data, target)

    for call in range(calls):
        timings.clear()
        loss = profiled(model, optimizer, data, target)
        print(
            json.dumps(
                {
                    "call": call,
                    "loss": loss,
                    "run_id": profiler.current_run_id,
                    # PyTorch extends a list with each result string (so, by characters).
                    "profiled": profiler.profile_result is not None,
                    "stop_to_results_s": timings[-1] if timings else None,
                }
            ),
            flush=True,
        )


def compiled_step() -> None:
    model = SmallCNN()
    optimizer, data, target = setup(model)
    compiled = torch.compile(model)
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(compiled(data), target)
    loss.backward()
    optimizer.step()
    print(json.dumps({"loss": loss.item()}), flush=True)


def loop(seconds: float, ready: str | None = None) -> None:
    model = SmallCNN()
    optimizer, data, target = setup(model)
    train_step(model, optimizer, data, target)  # warm-up: first-call allocations
    if ready:
        # Tells a profiler that attaches to this loop that it trains now (imports are over).
        open(ready, "w").close()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        train_step(model, optimizer, data, target)


def main() -> None:
    torch.set_num_threads(THREADS)
    mode = sys.argv[1]
    if mode == "strobelight":
        strobelight_calls(int(sys.argv[2]))
    elif mode == "compile":
        compiled_step()
    elif mode == "loop":
        loop(float(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
