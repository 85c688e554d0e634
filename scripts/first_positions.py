"""A copy of a kbert model that knows only its first N positions: the position table cut to its
first N rows, every other weight as it was.

It stands in for "a model pretrained at N tokens" when the only pretrained model at hand has
more positions (all-MiniLM-L6-v2 has 512): cut it to 128, then grow it back with
`kbert extend --max-position-embeddings 512`, and positions 128..511 start as copies of 0..127,
as they would for a model that never saw them (docs/real-data.md, the man-pages table).

usage: python scripts/first_positions.py MODEL_DIR OUT_DIR --positions N
Prints {"model_dir", "max_position_embeddings": {"from", "to"}} as JSON.
"""

import argparse
import json


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--positions", type=int, required=True)
    args = parser.parse_args()

    import kbert
    from kbert.extend import _regrown
    from kbert.formats.model_dir import save
    from kbert.model.bert import encoder_of

    model = kbert.load(args.model_dir)
    before = model.config.max_position_embeddings
    if not 0 < args.positions < before:
        parser.error(f"--positions {args.positions}: give fewer than the model's {before}")
    table = encoder_of(model).embeddings.position_embeddings.embeddings.path
    cut = _regrown(model, {"max_position_embeddings": args.positions}, {table: lambda rows: rows[: args.positions]})
    save(cut, args.out_dir)
    print(json.dumps({"model_dir": args.out_dir, "max_position_embeddings": {"from": before, "to": args.positions}}))


if __name__ == "__main__":
    main()
