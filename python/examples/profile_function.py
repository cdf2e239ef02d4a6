"""Profile one Python function with the bpfprof daemon (run `sudo bpfprof daemon` first)."""

import logging

import bpfprof

logging.basicConfig(level=logging.INFO)


@bpfprof.profile(sample_tags=["example"])
def work(n: int) -> int:
    return sum(i * i for i in range(n))


if __name__ == "__main__":
    print(work(20_000_000))
    result = work.profiler.profile_result
    if result:
        print("run", work.profiler.current_run_id, result["state"], result["samples"], "samples")
        for name, path in result["files"].items():
            print(f"  {name}: {path}")
