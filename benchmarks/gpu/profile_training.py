"""One training epoch of the SST main job's BiLSTM on CUDA under torch.profiler: where its 17 ms a step go."""

import os
import sys

from torch.profiler import ProfilerActivity, profile

from attnmetrics.app.cli import main

out = os.environ["OUT"]
args = [
    "train",
    "--dataset",
    "sst",
    "--data-dir",
    ".gpu/sst",
    "--embeddings",
    "random",
    "--device",
    "cuda",
    "--epochs",
    "1",
    "--out",
    "/tmp/train-torchprof",
    "--no-progress",
    "--limit",
    "1280",  # 40 steps: the profiler's table of a whole epoch's events takes minutes
]
main(args[:-5] + ["--out", "/tmp/train-warm", "--no-progress"])  # warm: imports, build, cuDNN plans
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    main(args)
ka = prof.key_averages()
with open(f"{out}/torchprof-train.txt", "w") as f:
    f.write(ka.table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=60))
    f.write("\n\n")
    f.write(ka.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60))
print("ok", file=sys.stderr)
