#!/usr/bin/env python3
"""Reads a TensorBoard log folder with the tensorboard package's own event reader and prints
every scalar as `tag step value`, sorted; exits 3 when tensorboard is not installed."""
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
except ImportError:
    sys.exit(3)

acc = event_accumulator.EventAccumulator(sys.argv[1], size_guidance={event_accumulator.SCALARS: 0})
acc.Reload()
for tag in sorted(acc.Tags()["scalars"]):
    for e in acc.Scalars(tag):
        print(f"{tag} {e.step} {e.value:.6g}")
