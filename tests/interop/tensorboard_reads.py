#!/usr/bin/env python3
"""Interop check: TensorBoard's own EventAccumulator reads the event files shardkit's tensorboard
monitor wrote, and every scalar it finds agrees with the csv_monitor's files of the same run: the
same tags (DeepSpeed's file names and headers), the same x-axis (samples) and the same values (the
CSV's at full precision, the event's as float32).

Usage: python3 tests/interop/tensorboard_reads.py FOLDER
FOLDER is output_path/job_name of a run whose tensorboard and csv_monitor sections write to the same
folder, e.g. from the repository root, after a build (CPU, a few seconds):
  mkdir -p runs && build/shardkit data encode samples/data/checkpoints.txt -o runs/text.bin
  build/shardkit train --config tests/interop/tensorboard_config.json --model gpt2-tiny \\
      --data runs/text.bin --steps 8 --save-dir runs/tensorboard-interop/ckpt --save-interval 4 --resume none
  python3 tests/interop/tensorboard_reads.py runs/tensorboard-interop/DeepSpeedJobName
Prints PASS or FAIL with each problem; exits 0 on PASS, 1 on FAIL, 2 when it cannot run."""
import csv
import glob
import os
import struct
import sys

# The tags DeepSpeed 0.14's engine writes for this config (fp16, wall_clock_breakdown), and shardkit's.
EXPECTED_TAGS = {
    "Train/Samples/train_loss", "Train/Samples/lr", "Train/Samples/loss_scale",
    "Train/Samples/elapsed_time_ms_forward", "Train/Samples/elapsed_time_ms_backward",
    "Train/Samples/elapsed_time_ms_backward_inner", "Train/Samples/elapsed_time_ms_backward_allreduce",
    "Train/Samples/elapsed_time_ms_step", "Train/Samples/tokens_per_s", "Train/Samples/grad_norm",
}


def csv_name(tag):
    """DeepSpeed's csv_monitor file name of a tag."""
    return tag.replace("/", "_").replace(" ", "_") + ".csv"


def as_float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    folder = sys.argv[1]
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as e:
        print(f"cannot run: TensorBoard is not installed ({e})", file=sys.stderr)
        return 2
    problems = []
    event_files = sorted(glob.glob(os.path.join(folder, "*tfevents*")))
    if not event_files:
        print(f"FAIL: no event file in {folder}")
        return 1
    acc = EventAccumulator(folder, size_guidance={"scalars": 0})  # 0: keep every scalar
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    missing = EXPECTED_TAGS - tags
    if missing:
        problems.append(f"tags missing from the event files: {sorted(missing)}")

    csv_files = {os.path.basename(p): p for p in glob.glob(os.path.join(folder, "*.csv"))}
    if set(csv_files) != {csv_name(t) for t in tags}:
        problems.append(f"CSV files {sorted(csv_files)} are not one per event tag {sorted(tags)}")
    compared = 0
    for tag in sorted(tags):
        events = acc.Scalars(tag)
        path = csv_files.get(csv_name(tag))
        if path is None:
            continue
        with open(path, newline="") as f:
            raw = f.read()
        if raw.count("\r\n") != raw.count("\n"):
            problems.append(f"{path}: rows do not all end in \\r\\n as DeepSpeed's csv.writer ends them")
        rows = list(csv.reader(raw.splitlines()))
        header, rows = rows[0], rows[1:]
        if header != ["step", tag.split("/")[-1]]:
            problems.append(f"{path}: header {header}, expected ['step', '{tag.split('/')[-1]}']")
        if len(rows) != len(events):
            problems.append(f"{tag}: {len(events)} events, {len(rows)} CSV rows")
            continue
        for event, (step, value) in zip(events, rows):
            if event.step != int(step) or event.value != as_float32(float(value)):
                problems.append(f"{tag}: event (step {event.step}, {event.value}) != CSV ({step}, {value})")
                break
            compared += 1
    def steps(tag):
        return [e.step for e in acc.Scalars(tag)] if tag in tags else []

    loss_steps, lr_steps = steps("Train/Samples/train_loss"), steps("Train/Samples/lr")
    # DeepSpeed's x-axis: the loss at the samples before each step, everything else after it.
    if loss_steps and lr_steps and loss_steps[1:] != lr_steps[:-1]:
        problems.append(f"x-axis: train_loss at {loss_steps}, lr at {lr_steps}")
    if problems:
        print("FAIL")
        for p in problems:
            print("  " + p)
        return 1
    print(f"PASS: {len(event_files)} event file(s), {len(tags)} tags, {compared} scalars equal to the CSV files "
          f"({folder})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
