"""kbert.finetuning.squad against google-research/bert's own run_squad.py, and the official SQuAD scores.

The original's read_squad_examples, convert_examples_to_features and write_predictions run
once, in a subprocess (tf1shim switches TensorFlow to graph mode), on hand-written SQuAD
v1.1 and v2.0 files: real English with punctuation glued to answers, accents, a sub-word
answer, tabs, newlines and U+202F in the context, a training answer that is not where its
offset says, impossible questions, a long question and a paragraph that needs many windows
at max_seq_length 64 / doc_stride 16. kbert must give the same features, and the same
predictions and n-best lists on the same random logits.
"""

import json
import logging
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from conftest import REFERENCE, TESTS, UNCASED_VOCAB
from kbert.finetuning.squad import SquadExample, read_squad, squad_evaluate, squad_features
from kbert.finetuning.squad_decoding import get_final_text, squad_predictions, write_predictions_json
from kbert.runtime.errors import KbertError, command_line_names
from kbert.text.tokenizer import Tokenizer

ROOT = os.path.dirname(TESTS)
HERE = os.path.dirname(os.path.abspath(__file__))
SEQ, STRIDE, QUERY = 64, 16, 16

BRIDGE = (
    "The railway bridge over the Rhine at Kehl was completed in 1861 (after four years of "
    "work) by Heinrich Gerber's firm.  Before it opened, travellers crossed the river on a "
    "ferry that ran every hour;\tthe crossing took roughly 20\u202fminutes.\nThe bridge was "
    "destroyed in 1870 and rebuilt two years later."
)
ZURICH = (
    "Zürich's café culture grew quickly after 1900, when the city's population passed "
    "150,000. The Japanese electronics firms that opened offices near the lake in the 1980s "
    "brought a wave of new restaurants, and by 1995 the old town (the Niederdorf) had more "
    "than 300 of them."
)
PRINTING = (
    "Before the printing press, books in Europe were copied by hand, usually by monks working in "
    "a scriptorium. A single Bible could take a scribe more than a year to finish, and the cost "
    "of parchment alone made books rare and expensive. Around 1440, Johannes Gutenberg, a "
    "goldsmith from\u00a0Mainz, began experimenting with movable metal type. His key invention "
    "was a hand mould that let a worker cast large numbers of identical letters quickly from an "
    "alloy of lead, tin and antimony. He also developed an oil-based ink that stuck to metal "
    "better than the water-based inks used for woodblocks, and he adapted the screw press that "
    "winemakers had used for centuries. By 1455 his workshop had printed about 180 copies of the "
    "Bible, of which 49 survive today. The new technique spread rapidly: within fifty years there "
    "were printing shops in more than 250 European cities, and an estimated twenty million "
    "volumes had been produced. Printed pamphlets carried the ideas of the Reformation across "
    "Germany, and scientists could now share accurate copies of their tables, diagrams and "
    "observations. Historians often describe the period after Gutenberg as the beginning of the "
    "print revolution."
)

LONG_QUESTION = (
    "In the years after the invention of movable metal type by the goldsmith from "
    "Mainz, roughly how many European cities had printing shops within fifty years?"
)


def qa(qid, question, context, answer, answer_start=None):
    start = context.index(answer) if answer_start is None else answer_start
    return {"id": qid, "question": question, "answers": [{"text": answer, "answer_start": start}]}


def impossible(qid, question, context, plausible):
    return {
        "id": qid,
        "question": question,
        "answers": [],
        "is_impossible": True,
        "plausible_answers": [{"text": plausible, "answer_start": context.index(plausible)}],
    }


def squad_v1():
    return {
        "version": "1.1",
        "data": [
            {
                "title": "Kehl",
                "paragraphs": [
                    {
                        "context": BRIDGE,
                        "qas": [
                            qa("b1", "When was the railway bridge at Kehl completed?", BRIDGE, "1861"),
                            qa("b2", "Whose firm built the bridge?", BRIDGE, "Heinrich Gerber"),
                            qa("b3", "How long did the ferry crossing take?", BRIDGE, "roughly 20\u202fminutes"),
                            qa("b4", "How many years did the construction take?", BRIDGE, "four"),
                            qa("b5", "In which year was the bridge destroyed?", BRIDGE, "1870"),
                            # The offset points at "two years later": run_squad.py skips it for training.
                            qa("b6", "When was the bridge rebuilt?", BRIDGE, "1872", BRIDGE.index("two years")),
                        ],
                    }
                ],
            },
            {
                "title": "Zürich",
                "paragraphs": [
                    {
                        "context": ZURICH,
                        "qas": [
                            qa("z1", "Which city is known for its café culture?", ZURICH, "Zürich"),
                            qa("z2", "Which country's firms opened offices near the lake?", ZURICH, "Japan"),
                            qa("z3", "What is the old town called?", ZURICH, "Niederdorf"),
                            qa("z4", "What did the population pass after 1900?", ZURICH, "150,000"),
                            qa("z5", "How many restaurants did the old town have by 1995?", ZURICH, "more than 300"),
                        ],
                    }
                ],
            },
            {
                "title": "Printing",
                "paragraphs": [
                    {
                        "context": PRINTING,
                        "qas": [
                            qa("g1", "Who copied books before the printing press?", PRINTING, "monks"),
                            qa("g2", "What was Gutenberg's trade?", PRINTING, "goldsmith"),
                            qa("g3", "Where was Gutenberg from?", PRINTING, "Mainz"),
                            qa(
                                "g4",
                                "Which metals made up the alloy used for type?",
                                PRINTING,
                                "lead, tin and antimony",
                            ),
                            qa("g5", "How many of Gutenberg's Bibles survive?", PRINTING, "49"),
                            qa("g6", LONG_QUESTION, PRINTING, "more than 250"),
                            qa(
                                "g7",
                                "What do historians call the period after Gutenberg?",
                                PRINTING,
                                "the beginning of the print revolution",
                            ),
                        ],
                    }
                ],
            },
        ],
    }


def squad_v2():
    data = squad_v1()
    data["version"] = "v2.0"
    for article in data["data"]:
        for paragraph in article["paragraphs"]:
            for question in paragraph["qas"]:
                question["is_impossible"] = False
    bridge, zurich, printing = (a["paragraphs"][0] for a in data["data"])
    bridge["qas"].insert(2, impossible("b7", "When was the tunnel at Kehl opened?", BRIDGE, "1861"))
    zurich["qas"].append(
        impossible("z6", "Which Japanese firm opened the first restaurant?", ZURICH, "Japanese electronics firms")
    )
    printing["qas"].insert(
        0, impossible("g8", "How many copies of the Koran did Gutenberg print?", PRINTING, "about 180")
    )
    printing["qas"].append(
        impossible("g9", "Who printed the first newspaper in Mainz?", PRINTING, "Johannes Gutenberg")
    )
    return data


# Each task: a file, how to read it, and (for evaluation) the logits to predict from.
TASKS = {
    "v1_train": dict(version_2=False, is_training=True, do_lower_case=True),
    "v1_eval": dict(
        version_2=False,
        is_training=False,
        do_lower_case=True,
        predictions=[
            dict(seed=0, quantized=False, n_best_size=20, max_answer_length=30, threshold=0.0),
            dict(seed=1, quantized=True, n_best_size=5, max_answer_length=4, threshold=0.0),
        ],
    ),
    "v1_eval_cased": dict(
        version_2=False,
        is_training=False,
        do_lower_case=False,
        predictions=[dict(seed=2, quantized=False, n_best_size=20, max_answer_length=30, threshold=0.0)],
    ),
    "v2_train": dict(version_2=True, is_training=True, do_lower_case=True),
    "v2_eval": dict(
        version_2=True,
        is_training=False,
        do_lower_case=True,
        predictions=[
            dict(seed=3, quantized=False, n_best_size=20, max_answer_length=30, threshold=0.0),
            dict(seed=4, quantized=True, n_best_size=10, max_answer_length=8, threshold=1.5),
        ],
    ),
}


# (pred_text, orig_text, do_lower_case) for get_final_text: the mapping back and its failures.
FINAL_TEXT_CASES = [
    ("steve smith", "Steve Smith's", True),
    ("1895", "(1895-1943).", True),
    ("zurich", "(Zürich),", True),
    ("istanbul", "İstanbul's", True),
    ("a", "Å", True),
    ("", "abc", True),
    ("b c", "a  b c", True),
    ("from mainz", "from\u00a0Mainz,", True),
    ("zurich", "Zürich", False),
    ("zurich", "ZÜRICH", True),
    ("strasse", "Straße", True),
    ("fi", "\ufb01", True),
    ("co", "co\u0301.", True),
    ("Steve", "Steve's", False),
    ("cafe", "Café au lait", True),
    ("雪", "大雪", True),
]


def random_logits(seed, num_features, quantized):
    """Start/end logits; half the features get a high [CLS] (so v2 predicts some "")."""
    rng = np.random.default_rng(seed)
    start, end = rng.normal(0.0, 2.0, size=(2, num_features, SEQ)).astype(np.float32)
    if quantized:  # many exact ties: the n-best order must break them as the original does
        start, end = np.round(start * 2) / 2, np.round(end * 2) / 2
    boosted = rng.random(num_features) < 0.5
    start[boosted, 0] += 6.0
    end[boosted, 0] += 6.0
    return start, end


def kbert_run(path, task):
    tokenizer = Tokenizer(UNCASED_VOCAB, do_lower_case=task["do_lower_case"])
    examples = read_squad(path, task["is_training"])
    arrays, features = squad_features(examples, tokenizer, SEQ, STRIDE, QUERY, task["is_training"])
    return examples, arrays, features


def run_original(spec_path):
    """Run in a subprocess: run_squad.py's own functions on each task; print one JSON object."""
    sys.path.insert(0, REFERENCE)
    from original import load_original

    tokenization = load_original("tokenization")
    run_squad = load_original(
        "run_squad",
        modeling=load_original("modeling"),
        optimization=load_original("optimization"),
        tokenization=tokenization,
    )
    flags = run_squad.FLAGS
    flags(["run_squad"])
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    out = {"final_text": [run_squad.get_final_text(*case) for case in FINAL_TEXT_CASES], "tasks": {}}
    for name, task in spec.items():
        flags.version_2_with_negative = task["version_2"]
        tokenizer = tokenization.FullTokenizer(UNCASED_VOCAB, do_lower_case=task["do_lower_case"])
        examples = run_squad.read_squad_examples(task["file"], is_training=task["is_training"])
        features = []
        run_squad.convert_examples_to_features(
            examples, tokenizer, SEQ, STRIDE, QUERY, task["is_training"], features.append
        )
        result = {
            "examples": [
                dict(
                    qas_id=e.qas_id,
                    doc_tokens=e.doc_tokens,
                    orig_answer_text=e.orig_answer_text,
                    start_position=e.start_position,
                    end_position=e.end_position,
                    is_impossible=e.is_impossible,
                )
                for e in examples
            ],
            "features": [
                dict(
                    example_index=f.example_index,
                    doc_span_index=f.doc_span_index,
                    tokens=f.tokens,
                    token_to_orig_map=sorted(f.token_to_orig_map.items()),
                    token_is_max_context=sorted(f.token_is_max_context.items()),
                    input_ids=f.input_ids,
                    input_mask=f.input_mask,
                    segment_ids=f.segment_ids,
                    start_position=f.start_position,
                    end_position=f.end_position,
                )
                for f in features
            ],
            "predictions": [],
        }
        for run in task.get("predictions", []):
            logits = np.load(run["logits"])
            if logits["start"].shape[0] != len(features):
                result["predictions"].append({"error": f"{len(features)} original features"})
                continue
            results = [
                run_squad.RawResult(
                    unique_id=f.unique_id,
                    start_logits=[float(x) for x in logits["start"][i]],
                    end_logits=[float(x) for x in logits["end"][i]],
                )
                for i, f in enumerate(features)
            ]
            flags.null_score_diff_threshold = run["threshold"]
            out_dir = tempfile.mkdtemp()
            files = [os.path.join(out_dir, n) for n in ("predictions.json", "nbest.json", "null_odds.json")]
            try:
                run_squad.write_predictions(
                    examples,
                    features,
                    results,
                    run["n_best_size"],
                    run["max_answer_length"],
                    task["do_lower_case"],
                    *files,
                )
            except Exception as e:  # e.g. v2 with no valid span: the original fails on None
                result["predictions"].append({"error": repr(e)})
                continue
            with open(files[0], encoding="utf-8") as p, open(files[1], encoding="utf-8") as n:
                result["predictions"].append({"predictions": json.load(p), "nbest": json.load(n)})
        out["tasks"][name] = result
    print(json.dumps(out))


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("squad")
    paths = {}
    for version, data in (("v1", squad_v1()), ("v2", squad_v2())):
        paths[version] = str(directory / f"{version}.json")
        with open(paths[version], "w", encoding="utf-8") as f:
            json.dump(data, f)
    return paths


@pytest.fixture(scope="module")
def original(data_files, tmp_path_factory):
    """{task: the original's examples, features and predictions}; logits come from kbert's feature count."""
    directory = tmp_path_factory.mktemp("original")
    spec = {}
    for name, task in TASKS.items():
        path = data_files[name[:2]]
        spec[name] = dict(task, file=path)
        if "predictions" in task:
            _, _, features = kbert_run(path, task)
            spec[name]["predictions"] = []
            for i, run in enumerate(task["predictions"]):
                start, end = random_logits(run["seed"], len(features), run["quantized"])
                np.savez(directory / f"{name}-{i}.npz", start=start, end=end)
                spec[name]["predictions"].append(dict(run, logits=str(directory / f"{name}-{i}.npz")))
    spec_path = directory / "spec.json"
    spec_path.write_text(json.dumps(spec))
    code = f"import sys; sys.path[:0] = [{HERE!r}, {TESTS!r}]; import test_squad; test_squad.run_original({str(spec_path)!r})"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_get_final_text_matches_original(original):
    assert [get_final_text(*case) for case in FINAL_TEXT_CASES] == original["final_text"]


# --- parity with run_squad.py -------------------------------------------------------------


@pytest.mark.parametrize("name", list(TASKS))
def test_examples_and_features_match_original(original, data_files, name):
    task = TASKS[name]
    examples, arrays, features = kbert_run(data_files[name[:2]], task)
    want = original["tasks"][name]

    assert [e.qas_id for e in examples] == [e["qas_id"] for e in want["examples"]]
    for got, exp in zip(examples, want["examples"]):
        assert got.doc_tokens == exp["doc_tokens"]
        assert (got.start_position, got.end_position) == (exp["start_position"], exp["end_position"])
        assert got.orig_answer_text == exp["orig_answer_text"]
        if task["is_training"]:  # the original reads is_impossible only for training
            assert got.is_impossible == exp["is_impossible"]

    assert len(features) == len(want["features"])
    for name_ in ("input_ids", "input_mask", "segment_ids"):
        assert arrays[name_].dtype == np.int32 and arrays[name_].shape == (len(features), SEQ)
        np.testing.assert_array_equal(arrays[name_], [f[name_] for f in want["features"]], err_msg=name_)
    if task["is_training"]:
        np.testing.assert_array_equal(arrays["start_positions"], [f["start_position"] for f in want["features"]])
        np.testing.assert_array_equal(arrays["end_positions"], [f["end_position"] for f in want["features"]])
    else:
        assert "start_positions" not in arrays
    for got, exp in zip(features, want["features"]):
        assert (got.example_index, got.doc_span_index) == (exp["example_index"], exp["doc_span_index"])
        assert got.tokens == exp["tokens"]
        assert sorted(got.token_to_orig_map.items()) == [tuple(p) for p in exp["token_to_orig_map"]]
        assert sorted(got.token_is_max_context.items()) == [tuple(p) for p in exp["token_is_max_context"]]


def test_the_data_exercises_what_it_should(data_files, caplog):
    """The cases the parity tests are meant to cover really occur in the data."""
    with caplog.at_level(logging.WARNING, logger="kbert"):
        examples, arrays, features = kbert_run(data_files["v1"], TASKS["v1_train"])
    assert "b6" not in [e.qas_id for e in examples]  # skipped: answer not at its offset
    assert any("skipped 1 of 18 training questions" in r.getMessage() for r in caplog.records)
    windows = [f.doc_span_index for f in features if examples[f.example_index].qas_id == "g1"]
    assert max(windows) >= 5  # the long paragraph needs many windows
    starts = arrays["start_positions"]
    assert (starts == 0).sum() > 0 and (starts > 0).sum() > 0  # windows without / with the answer
    g6 = [f for f in features if examples[f.example_index].qas_id == "g6"][0]
    assert g6.tokens.index("[SEP]") == QUERY + 1  # the long question was cut to 16 tokens
    # _improve_answer_span: "Gerber's" narrowed to "ge ##rber", "150,000." to "150 , 000".
    by_id = {
        examples[f.example_index].qas_id: (f, s, e)
        for f, s, e in zip(features, starts, arrays["end_positions"])
        if s > 0
    }
    f, s, e = by_id["b2"]
    assert f.tokens[s : e + 1] == ["heinrich", "ge", "##rber"]  # without "' s"
    f, s, e = by_id["z4"]
    assert f.tokens[s : e + 1] == ["150", ",", "000"]
    f, s, e = by_id["z2"]
    assert f.tokens[s : e + 1] == ["japanese"]  # a sub-word answer keeps the whole word


@pytest.mark.parametrize("name,run", [(n, i) for n, t in TASKS.items() for i in range(len(t.get("predictions", [])))])
def test_predictions_match_original(original, data_files, name, run):
    task = TASKS[name]
    config = task["predictions"][run]
    examples, _, features = kbert_run(data_files[name[:2]], task)
    start, end = random_logits(config["seed"], len(features), config["quantized"])
    predictions, nbest = squad_predictions(
        examples,
        features,
        start,
        end,
        n_best_size=config["n_best_size"],
        max_answer_length=config["max_answer_length"],
        do_lower_case=task["do_lower_case"],
        version_2_with_negative=task["version_2"],
        null_score_diff_threshold=config["threshold"],
    )
    want = original["tasks"][name]["predictions"][run]
    assert "error" not in want, want
    assert predictions == want["predictions"]
    assert json.loads(json.dumps(nbest)) == want["nbest"]  # texts, order and exact floats
    if task["version_2"]:  # both outcomes of the null rule occur
        assert "" in predictions.values() and any(predictions.values())


# --- predictions on logits with a known answer ----------------------------------------------

TREATY = "The treaty was signed by Steve Smith's brother in (Zürich), Switzerland, in 1903."


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(UNCASED_VOCAB, do_lower_case=True)


@pytest.fixture(scope="module")
def treaty(tokenizer):
    example = SquadExample("t1", "Who signed the treaty?", TREATY.split())
    _, features = squad_features([example], tokenizer, SEQ, STRIDE, QUERY)
    assert len(features) == 1
    return example, features


def logits_at(feature, start=(), end=(), null=(0.0, 0.0)):
    """Zero logits except start/end values at the first occurrence of the named document tokens."""
    s, e = np.zeros((2, 1, SEQ), np.float32)
    index = {t: feature.doc_offset + feature.tokens[feature.doc_offset :].index(t) for t, _ in (*start, *end)}
    for token, value in start:
        s[0, index[token]] = value
    for token, value in end:
        e[0, index[token]] = value
    s[0, 0], e[0, 0] = null
    return s, e


def test_prediction_maps_back_to_original_text(treaty):
    example, features = treaty
    s, e = logits_at(features[0], start=[("steve", 6.0)], end=[("smith", 6.0)])
    assert squad_predictions([example], features, s, e)[0] == {"t1": "Steve Smith"}  # not "Steve Smith's"
    s, e = logits_at(features[0], start=[("zurich", 6.0)], end=[("zurich", 6.0)])
    assert squad_predictions([example], features, s, e)[0] == {"t1": "Zürich"}  # not "(Zürich),"
    assert get_final_text("1903", "1903.", True) == "1903"
    assert get_final_text("zurich", "Zürich", False) == "Zürich"  # not found: the original text


def test_nbest_order_and_probabilities(treaty):
    example, features = treaty
    s, e = logits_at(features[0], start=[("steve", 4.0), ("brother", 2.0)], end=[("smith", 3.0), ("brother", 1.0)])
    # Candidates (start+end): steve-smith 7, steve-brother 5, brother-brother 3; brother-smith ends first.
    _, nbest = squad_predictions([example], features, s, e, n_best_size=3)
    texts = [entry["text"] for entry in nbest["t1"]]
    assert texts == ["Steve Smith", "Steve Smith's brother", "brother"]
    total = math.exp(7) + math.exp(5) + math.exp(3)
    for entry, score in zip(nbest["t1"], (7, 5, 3)):
        assert entry["probability"] == pytest.approx(math.exp(score) / total, rel=1e-12)
        assert entry["start_logit"] + entry["end_logit"] == score
    # n_best_size also caps the list (and the probabilities are over what is left).
    _, nbest = squad_predictions([example], features, s, e, n_best_size=2)
    assert [entry["text"] for entry in nbest["t1"]] == ["Steve Smith", "Steve Smith's brother"]
    assert nbest["t1"][0]["probability"] == pytest.approx(1 / (1 + math.exp(-2)), rel=1e-12)


def test_max_answer_length(treaty):
    example, features = treaty
    s, e = logits_at(features[0], start=[("steve", 5.0)], end=[("brother", 5.0), ("smith", 1.0)])
    # steve smith ' s brother is 5 tokens.
    assert squad_predictions([example], features, s, e, max_answer_length=5)[0]["t1"] == "Steve Smith's brother"
    assert squad_predictions([example], features, s, e, max_answer_length=4)[0]["t1"] == "Steve Smith"


def softmax_of_totals(entries):
    """run_squad.py's n-best probabilities: a softmax over each entry's start + end logit."""
    totals = np.array([entry["start_logit"] + entry["end_logit"] for entry in entries], np.float64)
    exp = np.exp(totals - totals.max())
    return exp / exp.sum()


def test_v2_null_threshold_both_ways(treaty):
    example, features = treaty
    # null 3 + 3 = 6, best span 2.5 + 2.5 = 5: score_null - best = 1.0.
    s, e = logits_at(features[0], start=[("steve", 2.5)], end=[("smith", 2.5)], null=(3.0, 3.0))
    for threshold, want in ((0.0, ""), (0.99, ""), (1.0, "Steve Smith"), (2.0, "Steve Smith")):
        predictions, nbest = squad_predictions(
            [example], features, s, e, version_2_with_negative=True, null_score_diff_threshold=threshold
        )
        assert predictions == {"t1": want}, threshold
        null = dict(nbest["t1"][0])
        assert null.pop("probability") == pytest.approx(softmax_of_totals(nbest["t1"])[0], abs=1e-6)
        assert null == {"text": "", "start_logit": 3.0, "end_logit": 3.0}
    # Without v2 the null span is never an answer.
    assert squad_predictions([example], features, s, e)[0] == {"t1": "Steve Smith"}


@pytest.fixture(scope="module")
def printing(tokenizer):
    example = SquadExample("p1", "What did Gutenberg invent?", PRINTING.split())
    _, features = squad_features([example], tokenizer, SEQ, STRIDE, QUERY)
    assert len(features) > 3
    return example, features


def test_v2_null_score_is_the_smallest_over_windows(printing):
    example, features = printing
    s, e = np.zeros((2, len(features), SEQ), np.float32)
    s[:, 0] = e[:, 0] = 8.0
    s[1, 0] = e[1, 0] = 1.0  # the smallest null: 2.0
    s[0, 0] = e[0, 0] = 5.0
    answer = features[1].doc_offset + 20  # a max-context token of window 1 (it has 20 tokens on its left)
    assert features[1].max_context[20]
    s[1, answer] = e[1, answer] = 1.5  # 3.0 beats the null's 2.0
    predictions, nbest = squad_predictions([example], features, s, e, version_2_with_negative=True)
    word = example.doc_tokens[features[1].orig_index[20]]
    assert predictions["p1"] != "" and predictions["p1"] in word
    null = [entry for entry in nbest["p1"] if entry["text"] == ""]
    assert [(n["start_logit"], n["end_logit"]) for n in null] == [(1.0, 1.0)]


def test_answer_starts_only_where_the_token_has_most_context(printing):
    example, features = printing
    # A document token in windows 0 and 1 whose max context is window 1.
    first, second = features[0], features[1]
    shift = STRIDE  # window 1 starts STRIDE document tokens after window 0
    i = next(
        i
        for i in range(len(first.orig_index))
        if not first.max_context[i] and i - shift >= 0 and second.max_context[i - shift]
    )
    s, e = np.full((2, len(features), SEQ), -10.0, np.float32)
    s[0, first.doc_offset + i] = e[0, first.doc_offset + i] = 9.0
    s[1, second.doc_offset + i - shift] = e[1, second.doc_offset + i - shift] = 2.0
    _, nbest = squad_predictions([example], features, s, e)
    assert (nbest["p1"][0]["start_logit"], nbest["p1"][0]["end_logit"]) == (2.0, 2.0)


def test_no_valid_span(treaty):
    example, features = treaty
    s, e = np.full((2, 1, SEQ), -1.0, np.float32)
    s[0, 0] = e[0, 0] = 9.0  # with n_best_size 1 only [CLS] is tried: never a valid span
    predictions, nbest = squad_predictions([example], features, s, e, n_best_size=1)
    assert predictions == {"t1": "empty"}  # the original's stand-in
    assert nbest["t1"] == [{"text": "empty", "probability": 1.0, "start_logit": 0.0, "end_logit": 0.0}]
    # v2: the original fails here (no non-null entry); kbert answers "no answer".
    predictions, nbest = squad_predictions([example], features, s, e, n_best_size=1, version_2_with_negative=True)
    assert predictions == {"t1": ""}
    assert nbest["t1"] == [{"text": "", "probability": 1.0, "start_logit": 9.0, "end_logit": 9.0}]


def test_logits_shape_is_checked(treaty):
    example, features = treaty
    with pytest.raises(ValueError, match=r"\[1 features, max_seq_length\]"):
        squad_predictions([example], features, np.zeros((2, SEQ)), np.zeros((2, SEQ)))


# --- evaluation ---------------------------------------------------------------------------


def gold(qid, *answers, impossible=False):
    return SquadExample(qid, "?", [], is_impossible=impossible, answers=list(answers))


def test_evaluate_v1_hand_computed():
    examples = [
        gold("e1", "Denver Broncos", "Broncos"),  # "the broncos": EM 1, F1 1 (2nd gold)
        gold("e2", "Eiffel Tower"),  # "The Eiffel Tower!": EM 1, F1 1
        gold("e3", "Paris"),  # "in Paris, France": F1 2*(1/3)*1/(4/3) = 0.5
        gold("e4", "a golden statue of Mary", "golden statue"),  # F1 max(0.75, 1/3)
        gold("e5", "1861"),  # no prediction: 0, 0
        gold("e6", "The"),
    ]  # "": v1 EM 1 ("" == ""), F1 0
    predictions = {
        "e1": "the broncos",
        "e2": "The Eiffel Tower!",
        "e3": "in Paris, France",
        "e4": "statue of the Virgin Mary",
        "e6": "",
        "not-asked": "x",
    }
    result = squad_evaluate(examples, predictions)
    assert result == {"exact_match": pytest.approx(50.0), "f1": pytest.approx(100 * 3.25 / 6), "total": 6}


def test_evaluate_v2_hand_computed():
    examples = [
        gold("n1", impossible=True),  # "": 1, 1
        gold("n2", impossible=True),  # "Kehl": 0, 0
        gold("n3", "1861"),  # "": 0, 0
        gold("n4", "the railway bridge"),  # "railway bridge at Kehl": EM 0, F1 2/3
        gold("n5", "The", "1870"),  # "The" normalizes to nothing and is dropped: 1, 1
        gold("n6", "the"),
    ]  # no gold left, so gold "": "" scores 1, 1
    predictions = {"n1": "", "n2": "Kehl", "n3": "", "n4": "railway bridge at Kehl", "n5": "1870", "n6": ""}
    result = squad_evaluate(examples, predictions)
    assert result == pytest.approx(
        {
            "exact_match": 50.0,
            "f1": 100 * (3 + 2 / 3) / 6,
            "total": 6,
            "HasAns_exact": 50.0,
            "HasAns_f1": 100 * (2 + 2 / 3) / 4,
            "HasAns_total": 4,
            "NoAns_exact": 50.0,
            "NoAns_f1": 50.0,
            "NoAns_total": 2,
        }
    )


def test_evaluate_reads_a_dataset_file(data_files):
    examples = read_squad(data_files["v2"], is_training=False)
    perfect = {e.qas_id: (e.answers[0] if e.answers else "") for e in examples}
    assert squad_evaluate(data_files["v2"], perfect) == {
        "exact_match": 100.0,
        "f1": 100.0,
        "total": 22,
        "HasAns_exact": 100.0,
        "HasAns_f1": 100.0,
        "HasAns_total": 18,
        "NoAns_exact": 100.0,
        "NoAns_f1": 100.0,
        "NoAns_total": 4,
    }
    wrong = dict(perfect, b1="1860", b7="1861")  # one answerable and one impossible question wrong
    result = squad_evaluate(data_files["v2"], wrong)
    assert result["exact_match"] == pytest.approx(100 * 20 / 22)
    assert result["HasAns_exact"] == pytest.approx(100 * 17 / 18)
    assert result["NoAns_exact"] == pytest.approx(75.0)
    assert squad_evaluate(data_files["v1"], perfect)["total"] == 18


# --- files ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content,message",
    [
        (None, "no such SQuAD file"),
        ('{"data": [', "is not SQuAD JSON: Expecting value at line 1 column 11"),
        ('{"version": "1.1"}', "is not SQuAD JSON: no 'data' list"),
        ("[1, 2]", "is not SQuAD JSON: no 'data' list"),
        ('{"data": [{"paragraphs": [{"qas": []}]}]}', "data[0].paragraphs[0] has no 'context' string"),
        ('{"data": [{"title": "x"}]}', "data[0] has no 'paragraphs' list"),
        (
            '{"data": [{"paragraphs": [{"context": "a b", "qas": [{"id": "q", "answers": []}]}]}]}',
            "data[0].paragraphs[0].qas[0] has no 'question' string",
        ),
        ('{"data": [{"paragraphs": [{"context": "a b", "qas": []}]}]}', "has no questions"),
        (
            '{"data": [{"paragraphs": [{"context": "a b", "qas": [{"id": "q", "question": "?", '
            '"answers": [{"text": "b", "answer_start": 9}]}]}]}]}',
            "answer_start 9",
        ),
        (
            '{"data": [{"paragraphs": [{"context": "a b", "qas": [{"id": "q", "question": "?", '
            '"answers": [{"text": "b", "answer_start": 2}, {"text": "a", "answer_start": 0}]}]}]}]}',
            "has 2 answers; training needs exactly 1",
        ),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "train.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(KbertError) as error:
        read_squad(path, is_training=True)
    text = str(error.value)
    assert text.startswith(str(path)) and "\n" not in text
    assert message in text


def test_bad_lengths_are_errors(tokenizer):
    with pytest.raises(
        KbertError,
        match=r"max_seq_length \(64\) must be greater than max_query_length \(64\) \+ 3; raise max_seq_length or "
        r"lower max_query_length$",
    ):
        squad_features([], tokenizer, max_seq_length=64, max_query_length=64)
    # `kbert finetune` names its flags; `kbert evaluate`, which has neither, names the command that has them.
    with command_line_names({"--max-seq-length", "--max-query-length"}), pytest.raises(KbertError) as raised:
        squad_features([], tokenizer, max_seq_length=64, max_query_length=64)
    assert str(raised.value).endswith("; raise --max-seq-length or lower --max-query-length")
    with command_line_names({"--input", "--batch-size"}), pytest.raises(KbertError) as raised:
        squad_features([], tokenizer, max_seq_length=64, max_query_length=64)
    assert str(raised.value).endswith(
        "; raise `kbert finetune --max-seq-length` or lower `kbert finetune --max-query-length`"
    )


def test_write_predictions_json_is_atomic(tmp_path):
    path = tmp_path / "predictions.json"
    write_predictions_json({"q1": "Zürich", "q2": ""}, path)
    assert json.loads(path.read_text()) == {"q1": "Zürich", "q2": ""}
    with pytest.raises(TypeError):
        write_predictions_json({"q1": object()}, path)
    assert json.loads(path.read_text()) == {"q1": "Zürich", "q2": ""}  # the old file, untouched
    assert os.listdir(tmp_path) == ["predictions.json"]


def test_no_tensorflow_import():
    code = "import sys, kbert.finetuning.squad; assert 'tensorflow' not in sys.modules, 'imports TF'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
