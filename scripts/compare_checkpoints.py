"""Compare the bert/ and cls/ tensors of two TF1 checkpoints bit for bit.

usage: python scripts/compare_checkpoints.py CKPT_A CKPT_B   (directories or prefixes)
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from kbert.cli.common import import_tensorflow_quietly

import_tensorflow_quietly()

import numpy as np  # noqa: E402

from kbert.converters.tf1 import find_checkpoint, is_optimizer_state, open_reader  # noqa: E402


def main(a, b):
    readers = [open_reader(find_checkpoint(p).prefix) for p in (a, b)]
    names = [
        {n for n in r.get_variable_to_shape_map() if n.startswith(("bert/", "cls/")) and not is_optimizer_state(n)}
        for r in readers
    ]
    differing = sorted(
        n for n in names[0] & names[1] if not np.array_equal(readers[0].get_tensor(n), readers[1].get_tensor(n))
    )
    result = {
        "variables": len(names[0]),
        "only_in_first": sorted(names[0] - names[1]),
        "only_in_second": sorted(names[1] - names[0]),
        "differing": differing,
    }
    result["identical"] = not (result["only_in_first"] or result["only_in_second"] or differing)
    print(json.dumps(result))
    return result["identical"]


if __name__ == "__main__":
    sys.exit(0 if main(*sys.argv[1:3]) else 1)
