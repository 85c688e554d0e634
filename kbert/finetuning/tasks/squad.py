"""squad: run_squad.py's start/end span head, SQuAD v1.1 and v2.0.

Reading, windows and scoring are run_squad.py's (`kbert.finetuning.squad`), its answers
decoded as run_squad.py writes them (`kbert.finetuning.squad_decoding`). A context longer than
the window is read in windows `--doc-stride` tokens apart, with questions of at most
`--max-query-length` tokens; the model records both. `kbert export` does not serve it yet.

Example:
>>> SQUAD.metric, SQUAD.max_seq_length
('f1', 384)
"""

from __future__ import annotations

import keras

from kbert.finetuning import squad_decoding
from kbert.finetuning.options import SQUAD_DOC_STRIDE, FinetuneOptions
from kbert.finetuning.squad import read_squad, squad_evaluate, squad_features
from kbert.finetuning.tasks.base import Task, TaskData
from kbert.model import bert
from kbert.runtime.errors import KbertError, option
from kbert.text.tokenizer import Tokenizer


def squad_answers(data: TaskData, outputs, *, options: FinetuneOptions, do_lower_case=True):
    """(best answer per question id, n-best lists), decoded as run_squad.py writes them."""
    v2 = any(getattr(e, "is_impossible", False) for e in data.raw)
    return squad_decoding.squad_predictions(
        data.raw,
        data.extra,
        outputs["start_logits"],
        outputs["end_logits"],
        n_best_size=options.n_best_size,
        max_answer_length=options.max_answer_length,
        do_lower_case=do_lower_case,
        version_2_with_negative=v2,
        null_score_diff_threshold=options.null_score_diff_threshold,
    )


class Squad(Task):
    """The answer to a question: a span of its context."""

    name = "squad"
    metric = "f1"
    max_seq_length = 384
    head = "span_predictor"
    reads_doc_stride = True
    own_options = ("max_query_length", "n_best_size", "max_answer_length", "null_score_diff_threshold")

    def read_examples(self, path, *, options, require_labels, training):
        examples = read_squad(path, is_training=training)
        if not examples:
            raise KbertError(f"{path} holds no SQuAD questions; pass a SQuAD v1.1 or v2.0 JSON file")
        return examples

    def encode(self, examples, *, path, preprocessor, labels, options, require_labels, training):
        # run_squad.py's windows stay in Python: they map answers between characters and pieces.
        tokenizer = Tokenizer(preprocessor.vocab_file, do_lower_case=preprocessor.do_lower_case)
        arrays, features = squad_features(
            examples,
            tokenizer,
            preprocessor.sequence_length,
            options.doc_stride or SQUAD_DOC_STRIDE,
            options.max_query_length,
            is_training=training,
        )
        inputs = {k: arrays[k] for k in ("input_ids", "input_mask", "segment_ids")}
        targets = (
            {"start_logits": arrays["start_positions"], "end_logits": arrays["end_positions"]} if training else None
        )
        return TaskData(inputs, targets, None, len(features), 0, examples, features)

    def why_no_windows(self):
        return f"squad reads long contexts in windows already ({option('doc_stride')})"

    def build(self, base, *, labels, task_info=None):
        return bert.bert_span_predictor(base, task_info=task_info)

    def losses(self, options=None):
        # run_squad.py: total_loss = (start_loss + end_loss) / 2.
        ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        return {"start_logits": ce, "end_logits": ce}, {"start_logits": 0.5, "end_logits": 0.5}

    def record(self, opts, max_seq_length, data):
        return {"doc_stride": opts.doc_stride or SQUAD_DOC_STRIDE, "max_query_length": opts.max_query_length}

    def score(self, data, outputs, *, options, do_lower_case):
        answers, _ = squad_answers(data, outputs, options=options, do_lower_case=do_lower_case)
        return squad_evaluate(data.raw, answers)

    def examples_scored(self, data):
        return len(data.raw)  # questions, not windows

    def best_predictions(self, data, outputs, *, options, do_lower_case):
        answers, _ = squad_answers(data, outputs, options=options, do_lower_case=do_lower_case)
        return answers

    def rows(self, data, outputs, *, options, do_lower_case):
        answers, nbest = squad_answers(data, outputs, options=options, do_lower_case=do_lower_case)
        for example in data.raw:
            best = nbest.get(example.qas_id) or [{}]
            yield {
                "id": example.qas_id,
                "answer": answers.get(example.qas_id, ""),
                "probability": round(float(best[0].get("probability", 0.0)), 6),
            }


SQUAD = Squad()
