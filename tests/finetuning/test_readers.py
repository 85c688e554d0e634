"""kbert.finetuning.readers and .encoding: reading fine-tuning files and building features.

Features (packed in the graph by BertPreprocessor, as exports pack them) and GLUE reading are
compared with google-research/bert's own run_classifier.py (PyPI bert-tensorflow 1.0.4), run
in a subprocess because its TF1 shim switches TensorFlow to graph mode: its
`convert_single_example` on real text with the real uncased vocab, and its MRPC, CoLA and
MNLI processors on files in the GLUE layouts. Tagging's packing is kbert's own rule, checked
against hand-worked expectations.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import FIXTURES, REFERENCE, TESTS, UNCASED_VOCAB
from kbert.finetuning import readers
from kbert.finetuning.encoding import encode_tagged, encode_texts
from kbert.finetuning.readers import read_tagged_examples, read_text_examples
from kbert.runtime.errors import KbertError, command_line_names
from kbert.text.graph_packer import BertPreprocessor
from kbert.text.tokenizer import Tokenizer

ROOT = os.path.dirname(TESTS)
SAMPLE = os.path.join(FIXTURES, "sample_text.txt")

# Rows as the GLUE download script writes them (first rows of the real files), tab-separated.
MRPC_HEADER = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
MRPC_TRAIN = MRPC_HEADER + (
    '1\t702876\t702977\tAmrozi accused his brother , whom he called " the witness " , of '
    'deliberately distorting his evidence .\tReferring to him as only " the witness " , Amrozi '
    "accused his brother of deliberately distorting his evidence .\n"
    "0\t2108705\t2108831\tYucaipa owned Dominick 's before selling the chain to Safeway in 1998 "
    "for $ 2.5 billion .\tYucaipa bought Dominick 's in 1995 for $ 693 million and sold it to "
    "Safeway for $ 1.8 billion in 1998 .\n"
)
MRPC_TEST = (
    "index\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
    "0\t1089874\t1089925\tPCCW 's chief operating officer , Mike Butcher , and Alex "
    "Arena , the chief financial officer , will report directly to Mr So .\tCurrent "
    "Chief Operating Officer Mike Butcher and Group Chief Financial Officer Alex Arena "
    "will report to So .\n"
)
COLA_TRAIN = (
    "gj04\t1\t\tOur friends won't buy this analysis, let alone the next one we propose.\n"
    "gj04\t0\t*\tThey drank the pub.\n"
)
COLA_TEST = "index\tsentence\n0\tBill whistled past the house.\n"
SST2_TRAIN = (
    "sentence\tlabel\nhide new secretions from the parental units \t0\n"
    "that loves its characters and communicates something rather beautiful about "
    "human nature \t1\n"
)
SST2_TEST = "index\tsentence\n0\tuneasy mishmash of styles and genres .\n"
STSB_HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
STSB_TRAIN = (
    STSB_HEADER + "\tscore\n"
    "0\tmain-captions\tMSRvid\t2012test\t0001\tnone\tnone\tA plane is taking off.\t"
    "An air plane is taking off.\t5.000\n"
    "1\tmain-captions\tMSRvid\t2012test\t0004\tnone\tnone\tA man is playing a large "
    "flute.\tA man is playing a flute.\t3.800\n"
)
STSB_TEST = (
    STSB_HEADER + "\n0\tmain-captions\tMSRvid\t2012test\t0024\tnone\tnone\tA girl is "
    "styling her hair.\tA girl is brushing her hair.\n"
)
MNLI_HEADER = (
    "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\t"
    "sentence1_parse\tsentence2_parse\tsentence1\tsentence2"
)
MNLI_TRAIN = (
    MNLI_HEADER + "\tlabel1\tgold_label\n"
    "0\t31193\t31193n\tgovernment\t( ( Conceptually ( cream skimming ) ) ... )\t"
    "( ( Product ... ) )\t(ROOT (S ...))\t(ROOT (S ...))\tConceptually cream skimming "
    "has two basic dimensions - product and geography.\tProduct and geography are what "
    "make cream skimming work. \tneutral\tneutral\n"
)
MNLI_DEV = (
    MNLI_HEADER + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label\n"
    "0\t63735\t63735n\tslate\t( ... )\t( ... )\t(ROOT ...)\t(ROOT ...)\tThe new rights "
    "are nice enough\tEveryone really likes the newest benefits \tneutral\tentailment\t"
    "neutral\tneutral\tneutral\tneutral\n"
)
MNLI_TEST = (
    MNLI_HEADER + "\n0\t31493\t31493\ttravel\t( ... )\t( ... )\t(ROOT ...)\t(ROOT ...)\t"
    "Hierbas, ans seco, ans dulce, and frigola are just a few names worth keeping a "
    "look-out for.\tHierbas is a name worth looking out for.\n"
)
QNLI_TRAIN = (
    "index\tquestion\tsentence\tlabel\n0\tWhen did the third Digimon series begin?\t"
    "Unlike the two seasons before it, Digimon Tamers takes a darker approach.\t"
    "not_entailment\n"
)
QNLI_TEST = (
    "index\tquestion\tsentence\n0\tWhat organization is devoted to Jihad against "
    "Israel?\tFor some decades prior to the First Palestine Intifada in 1987, ...\n"
)
QQP_TRAIN = (
    "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n133273\t213221\t213222\tHow "
    "is the life of a math student? Could you describe your own experiences?\tWhich level "
    "of prepration is enough for the exam jlpt5?\t0\n"
)
QQP_TEST = (
    "id\tquestion1\tquestion2\n0\tHow does the Surface Pro himself 4 compare with iPad "
    "Pro?\tWhy did Microsoft choose core m3 and not core i3 home Surface Pro 4?\n"
)
RTE_TRAIN = (
    "index\tsentence1\tsentence2\tlabel\n0\tNo Weapons of Mass Destruction Found in "
    "Iraq Yet.\tWeapons of Mass Destruction Found in Iraq.\tnot_entailment\n"
)
RTE_TEST = "index\tsentence1\tsentence2\n0\tMamma Mia! is a musical.\tMamma Mia! is a Broadway show.\n"

# The reference: run_classifier.py's convert_single_example and GLUE processors, as JSON.
ORIGINAL_SCRIPT = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from absl import flags
from original import load_original
tokenization = load_original("tokenization")
modeling = load_original("modeling")
optimization = load_original("optimization")
run_classifier = load_original("run_classifier", modeling=modeling, optimization=optimization,
                               tokenization=tokenization)
flags.FLAGS(["original"])
run_classifier.tf.logging.set_verbosity(run_classifier.tf.logging.ERROR)
job = json.load(open(sys.argv[2], encoding="utf-8"))
tokenizer = tokenization.FullTokenizer(job["vocab"], do_lower_case=True)
features = []
for i, (a, b, length) in enumerate(job["cases"]):
    example = run_classifier.InputExample(guid=str(i), text_a=a, text_b=b, label="0")
    f = run_classifier.convert_single_example(i, example, ["0"], length, tokenizer)
    features.append([f.input_ids, f.input_mask, f.segment_ids])
glue = {}
for task, data_dir in job["glue"].items():
    processor = {"mrpc": run_classifier.MrpcProcessor, "cola": run_classifier.ColaProcessor,
                 "mnli": run_classifier.MnliProcessor}[task]()
    glue[task] = {split: [[e.text_a, e.text_b, e.label] for e in getattr(processor, f"get_{split}_examples")(data_dir)]
                  for split in ("train", "dev", "test")}
print(json.dumps({"features": features, "glue": glue}))
"""
ORIGINAL_GLUE_FILES = {
    "mrpc": {"train.tsv": MRPC_TRAIN, "dev.tsv": MRPC_TRAIN, "test.tsv": MRPC_TEST},
    "cola": {"train.tsv": COLA_TRAIN, "dev.tsv": COLA_TRAIN, "test.tsv": COLA_TEST},
    "mnli": {"train.tsv": MNLI_TRAIN, "dev_matched.tsv": MNLI_DEV, "test_matched.tsv": MNLI_TEST},
}


def sample_lines():
    with open(SAMPLE, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def comparison_cases():
    """(text_a, text_b or None, max_seq_length): real text, pairs and singles, tiny lengths."""
    lines = sample_lines()
    cases = []
    for length in (3, 4, 5, 8, 16, 40, 128):
        cases += [(a, b, length) for a, b in zip(lines, lines[1:])]
        cases += [(b, a[:30], length) for a, b in zip(lines[::3], lines[1::3])]  # a long, b short
    for length in (3, 8, 128):  # 3: [CLS] x [SEP], the least BertPreprocessor packs
        cases += [(a, None, length) for a in lines]
    # An empty or token-less second text makes a single text, in the original as here.
    cases += [
        (lines[0], "", 16),
        (lines[1], " \x00 ", 16),
        ("", lines[2], 16),
        ("", "", 8),
        ("", None, 4),
        ("Ünïcödé 力加勝北区", "ᴵᴺᵀᵃছজ", 8),
    ]
    return cases


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    base = tmp_path_factory.mktemp("original")
    glue = {}
    for task, files in ORIGINAL_GLUE_FILES.items():
        (base / task).mkdir()
        for name, content in files.items():
            (base / task / name).write_text(content, encoding="utf-8")
        glue[task] = str(base / task)
    job = base / "job.json"
    job.write_text(json.dumps({"vocab": UNCASED_VOCAB, "cases": comparison_cases(), "glue": glue}), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-c", ORIGINAL_SCRIPT, REFERENCE, str(job)], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    out["dirs"] = glue
    return out


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(UNCASED_VOCAB, do_lower_case=True)


def write(tmp_path, name, content):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8", newline="")
    return path


def packer(length, vocab=UNCASED_VOCAB):
    return BertPreprocessor(vocab, do_lower_case=True, sequence_length=length)


# === encode_texts (BertPreprocessor's packing) against run_classifier.convert_single_example ===


def test_encode_texts_matches_convert_single_example(original):
    cases = comparison_cases()
    assert len(original["features"]) == len(cases)
    by_length = {}
    for index, (_a, b, length) in enumerate(cases):
        by_length.setdefault((length, b is None), []).append(index)
    checked = 0
    for (length, single), indices in by_length.items():
        texts = [cases[i][0] for i in indices]
        texts_b = None if single else [cases[i][1] for i in indices]
        features, _ = encode_texts(packer(length), texts, texts_b)
        for row, i in enumerate(indices):
            want_ids, want_mask, want_segments = original["features"][i]
            assert features["input_ids"][row].tolist() == want_ids, cases[i]
            assert features["input_mask"][row].tolist() == want_mask, cases[i]
            assert features["segment_ids"][row].tolist() == want_segments, cases[i]
            checked += 1
        assert all(v.dtype == np.int32 and v.shape == (len(indices), length) for v in features.values())
    assert checked == len(cases)
    # The comparison saw pairs that were cut, and second segments.
    assert any(1 in f[2] for f in original["features"])


def test_truncated_count_and_pair_cut(tokenizer):
    a = "the quick brown fox jumps"  # 5 tokens
    b = "over the lazy dog"  # 4 tokens
    features, truncated = encode_texts(packer(8), [a, a, "hi"], [b, "", "there"])
    # Pair 1: 9 tokens for 5 places, cut from the longer text, from b on ties:
    # (5, 4) -> (4, 4) -> (4, 3) -> (3, 3) -> (3, 2).
    assert tokenizer.convert_ids_to_tokens(features["input_ids"][0]) == [
        "[CLS]",
        "the",
        "quick",
        "brown",
        "[SEP]",
        "over",
        "the",
        "[SEP]",
    ]
    assert features["segment_ids"][0].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]
    # Example 2 has an empty second text: single, 5 tokens fit in 6.
    assert features["segment_ids"][1].tolist() == [0] * 8
    assert features["input_mask"][1].tolist() == [1] * 7 + [0]
    assert truncated == 1
    _, truncated = encode_texts(packer(6), [a, a, "hi"], None)
    assert truncated == 2
    # A pair cut exactly to fit, and one a token over: only the second is counted.
    _, truncated = encode_texts(packer(12), [a, a + " again"], [b, b])
    assert truncated == 1
    with pytest.raises(ValueError, match="at least 3"):
        packer(2)


# === GLUE layouts ===


GLUE_CASES = [
    # (file contents, task, format read, texts, texts_b, labels)
    (
        MRPC_TRAIN,
        "classify",
        "mrpc",
        [
            'Amrozi accused his brother , whom he called " the witness " , of deliberately distorting his evidence .',
            "Yucaipa owned Dominick 's before selling the chain to Safeway in 1998 for $ 2.5 billion .",
        ],
        [
            'Referring to him as only " the witness " , Amrozi accused his brother of deliberately '
            "distorting his evidence .",
            "Yucaipa bought Dominick 's in 1995 for $ 693 million and sold it to Safeway for $ 1.8 billion in 1998 .",
        ],
        ["1", "0"],
    ),
    (
        MRPC_TEST,
        "classify",
        "mrpc",
        [
            "PCCW 's chief operating officer , Mike Butcher , and Alex Arena , the chief financial "
            "officer , will report directly to Mr So ."
        ],
        [
            "Current Chief Operating Officer Mike Butcher and Group Chief Financial Officer Alex Arena "
            "will report to So ."
        ],
        None,
    ),
    (
        COLA_TRAIN,
        "classify",
        "cola",
        ["Our friends won't buy this analysis, let alone the next one we propose.", "They drank the pub."],
        None,
        ["1", "0"],
    ),
    (
        SST2_TRAIN,
        "classify",
        "sst2",
        [
            "hide new secretions from the parental units ",
            "that loves its characters and communicates something rather beautiful about human nature ",
        ],
        None,
        ["0", "1"],
    ),
    (SST2_TEST, "classify", "sst2", ["uneasy mishmash of styles and genres ."], None, None),
    (
        STSB_TRAIN,
        "regress",
        "stsb",
        ["A plane is taking off.", "A man is playing a large flute."],
        ["An air plane is taking off.", "A man is playing a flute."],
        [5.0, 3.8],
    ),
    (STSB_TEST, "regress", "stsb", ["A girl is styling her hair."], ["A girl is brushing her hair."], None),
    (
        MNLI_TRAIN,
        "classify",
        "mnli",
        ["Conceptually cream skimming has two basic dimensions - product and geography."],
        ["Product and geography are what make cream skimming work. "],
        ["neutral"],
    ),
    (
        MNLI_DEV,
        "classify",
        "mnli",
        ["The new rights are nice enough"],
        ["Everyone really likes the newest benefits "],
        ["neutral"],
    ),  # gold_label, not label2
    (
        MNLI_TEST,
        "classify",
        "mnli",
        ["Hierbas, ans seco, ans dulce, and frigola are just a few names worth keeping a look-out for."],
        ["Hierbas is a name worth looking out for."],
        None,
    ),
    (
        QNLI_TRAIN,
        "classify",
        "qnli",
        ["When did the third Digimon series begin?"],
        ["Unlike the two seasons before it, Digimon Tamers takes a darker approach."],
        ["not_entailment"],
    ),
    (
        QNLI_TEST,
        "classify",
        "qnli",
        ["What organization is devoted to Jihad against Israel?"],
        ["For some decades prior to the First Palestine Intifada in 1987, ..."],
        None,
    ),
    (
        QQP_TRAIN,
        "classify",
        "qqp",
        ["How is the life of a math student? Could you describe your own experiences?"],
        ["Which level of prepration is enough for the exam jlpt5?"],
        ["0"],
    ),
    (
        QQP_TEST,
        "classify",
        "qqp",
        ["How does the Surface Pro himself 4 compare with iPad Pro?"],
        ["Why did Microsoft choose core m3 and not core i3 home Surface Pro 4?"],
        None,
    ),
    (
        RTE_TRAIN,
        "classify",
        "rte",
        ["No Weapons of Mass Destruction Found in Iraq Yet."],
        ["Weapons of Mass Destruction Found in Iraq."],
        ["not_entailment"],
    ),
    (RTE_TEST, "classify", "rte", ["Mamma Mia! is a musical."], ["Mamma Mia! is a Broadway show."], None),
]


@pytest.mark.parametrize(
    "content,task,fmt,texts,texts_b,labels",
    GLUE_CASES,
    ids=[f"{c[2]}-{'test' if c[5] is None else 'train'}-{i}" for i, c in enumerate(GLUE_CASES)],
)
def test_glue_layouts_are_recognised(tmp_path, content, task, fmt, texts, texts_b, labels):
    path = write(tmp_path, "train.tsv", content)
    got = read_text_examples(path, scores=task == "regress", require_labels=labels is not None)
    assert (got.format, got.texts, got.texts_b, got.labels) == (fmt, texts, texts_b, labels)
    assert got.skipped_rows == [] and got.replaced_bytes == 0
    # The same file named explicitly reads the same.
    explicit = read_text_examples(path, scores=task == "regress", format=fmt, require_labels=labels is not None)
    assert (explicit.texts, explicit.texts_b, explicit.labels) == (texts, texts_b, labels)
    if labels is None:  # a test set: labels are required for training
        with pytest.raises(KbertError, match="no label column"):
            read_text_examples(path, scores=task == "regress")


def test_glue_reads_like_the_original_processors(original):
    for task, splits in original["glue"].items():
        for split, want in splits.items():
            name = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}[split]
            if task == "mnli":
                name = {"dev": "dev_matched.tsv", "test": "test_matched.tsv"}.get(split, name)
            got = read_text_examples(
                os.path.join(original["dirs"][task], name), format=task, require_labels=split != "test"
            )
            assert got.texts == [a for a, _, _ in want], (task, split)
            assert got.texts_b == (None if task == "cola" else [b for _, b, _ in want])
            if split != "test":  # the original fills test labels with a placeholder
                assert got.labels == [label for _, _, label in want]
            assert want  # the original read rows


def test_cola_explicit_format_reads_its_test_header(tmp_path):
    path = write(tmp_path, "test.tsv", COLA_TEST)
    got = read_text_examples(path, format="cola", require_labels=False)
    assert (got.format, got.texts, got.labels) == ("cola", ["Bill whistled past the house."], None)


def test_headerless_tsv_that_is_not_cola_is_a_header_error(tmp_path):
    path = write(tmp_path, "train.tsv", "gj04\tmaybe\t\tA sentence.\n")
    with pytest.raises(KbertError, match=r"names no text column \(found: gj04, maybe, , A sentence.\)"):
        read_text_examples(path)


# === generic CSV / TSV / JSONL and auto-detection ===


def test_generic_tsv_pairs_and_quote_characters(tmp_path):
    path = write(tmp_path, "data.tsv", 'id\ttext\ttext_b\tlabel\n1\tHe said "hi\tOK\tyes\n2\tNo quotes\t\tno\n')
    got = read_text_examples(path)
    assert (got.format, got.texts, got.texts_b, got.labels) == (
        "tsv",
        ['He said "hi', "No quotes"],
        ["OK", ""],
        ["yes", "no"],
    )


def test_windows_line_endings(tmp_path):
    path = write(tmp_path, "data.tsv", "text\tlabel\r\na\t1\r\nb\r\nc\t0\r\n")
    with pytest.raises(KbertError, match=r"at line 3 \(line 3: expected 2 tab-separated columns, found 1\)"):
        read_text_examples(path)
    got = read_text_examples(path, skip_bad_rows=True)
    assert (got.texts, got.labels, got.skipped_rows) == (["a", "c"], ["1", "0"], [3])


def test_csv_uses_quoting_and_counts_lines_of_multiline_fields(tmp_path):
    path = write(tmp_path, "data.csv", 'Text,Label\n"Hello, ""world""",pos\n"two\nlines",neg\nbad row,neg,extra\n')
    with pytest.raises(KbertError, match=r"line 5 \(line 5: expected 2 comma-separated columns, found 3\)"):
        read_text_examples(path)
    got = read_text_examples(path, skip_bad_rows=True)
    assert (got.format, got.texts, got.labels) == ("csv", ['Hello, "world"', "two\nlines"], ["pos", "neg"])
    assert got.skipped_rows == [5]


def test_jsonl_with_pairs_numbers_and_optional_labels(tmp_path):
    path = write(tmp_path, "data.jsonl", '{"text": "a", "text_b": "b", "label": 1}\n\n{"text_a": "c", "label": "x"}\n')
    got = read_text_examples(path)
    assert (got.format, got.texts, got.texts_b, got.labels) == ("jsonl", ["a", "c"], ["b", ""], ["1", "x"])
    regress = write(tmp_path, "r.json", '{"text": "a", "label": 0.5}\n{"text": "b", "label": "2"}\n')
    assert read_text_examples(regress, scores=True).labels == [0.5, 2.0]
    unlabelled = write(tmp_path, "p.jsonl", '{"text": "a"}\n{"text": "b"}\n')
    got = read_text_examples(unlabelled, require_labels=False)
    assert (got.texts, got.texts_b, got.labels) == (["a", "b"], None, None)
    with pytest.raises(KbertError, match=r"lines 1, 2 .*no label"):
        read_text_examples(unlabelled)


@pytest.mark.parametrize(
    "name,content,fmt",
    [
        ("a.csv", "text,label\nx,1\n", "csv"),
        ("a.CSV", "text,label\nx,1\n", "csv"),
        # A TSV whose first column's name starts with "{": read as TSV for its extension alone.
        ("a.tsv", "{id}\ttext\tlabel\n7\tx\t1\n", "tsv"),
        ("a.txt", "{id}\ttext\tlabel\n7\tx\t1\n", "tsv"),
        ("a.jsonl", '{"text": "x", "label": "1"}\n', "jsonl"),
        ("a.json", '{"text": "x", "label": "1"}\n', "jsonl"),
        ("a.data", '{"text": "x", "label": "1"}\n', "jsonl"),
        ("noext", "text\tlabel\nx\t1\n", "tsv"),
    ],
)
def test_auto_format_by_extension(tmp_path, name, content, fmt):
    got = read_text_examples(write(tmp_path, name, content))
    assert (got.format, got.texts, got.labels) == (fmt, ["x"], ["1"])


@pytest.mark.parametrize("name", ["a.jsonl", "a.json"])
def test_a_json_extension_reads_json_lines_whatever_the_first_line(tmp_path, name):
    # A first line that does not start with "{" would be read as TSV but for the extension.
    with pytest.raises(KbertError, match="holds a JSON array; write JSON Lines instead"):
        read_text_examples(write(tmp_path, name, '["x", "1"]\n'))


def test_explicit_format_overrides_detection(tmp_path):
    path = write(tmp_path, "data.txt", '{"text": "x", "label": "1"}\n')
    assert read_text_examples(path, format="jsonl").texts == ["x"]
    with pytest.raises(KbertError, match="names no text column"):
        read_text_examples(path)  # .txt is TSV
    sst = write(tmp_path, "sst.tsv", SST2_TRAIN)
    with pytest.raises(KbertError, match="names no text column"):
        read_text_examples(sst, format="tsv")  # generic TSV: no GLUE detection
    with pytest.raises(KbertError, match="unknown data format 'xml'"):
        read_text_examples(sst, format="xml")


def test_header_without_text_column_lists_columns_and_accepted_names(tmp_path):
    path = write(tmp_path, "data.csv", "sentence_x,label\nhi,1\n")
    with pytest.raises(KbertError) as error:
        read_text_examples(path)
    message = str(error.value)
    assert "\n" not in message and str(path) in message
    assert "found: sentence_x, label" in message and "text or text_a" in message


def test_require_labels(tmp_path):
    path = write(tmp_path, "data.tsv", "text\tid\nx\t1\n")
    with pytest.raises(KbertError, match=r"no label column \(columns: text, id\)"):
        read_text_examples(path)
    assert read_text_examples(path, require_labels=False).labels is None
    # With labels optional, a missing label is not a bad row, and a partial set is no set.
    partial = write(tmp_path, "partial.tsv", "text\tlabel\nx\t1\ny\t\n")
    got = read_text_examples(partial, require_labels=False)
    assert (got.texts, got.labels, got.skipped_rows) == (["x", "y"], None, [])
    with pytest.raises(KbertError, match=r"line 3 \(line 3: empty label\)"):
        read_text_examples(partial)


# === bad input ===


def test_bad_rows_fail_with_line_numbers_or_are_skipped(tmp_path):
    rows = ["text\tlabel"] + [f"good {i}\t1" if i % 3 else f"bad {i}" for i in range(1, 40)]
    rows.insert(3, "")  # a blank line is skipped but still counts in line numbers
    path = write(tmp_path, "data.tsv", "\n".join(rows) + "\n")
    bad_lines = [i + 1 for i, row in enumerate(rows) if row.startswith("bad")]
    assert len(bad_lines) == 13
    with pytest.raises(KbertError) as error:
        read_text_examples(path)
    message = str(error.value)
    assert "\n" not in message and str(path) in message and message.endswith("pass skip_bad_rows=True to skip them")
    with command_line_names({"--skip-bad-rows"}), pytest.raises(KbertError) as error:  # as `kbert finetune` says it
        read_text_examples(path)
    assert str(error.value).endswith("fix them, or pass --skip-bad-rows to skip them")
    listed = ", ".join(map(str, bad_lines[:10]))
    assert f"lines {listed} and 3 more (line {bad_lines[0]}: expected 2 tab-separated columns, found 1)" in message
    got = read_text_examples(path, skip_bad_rows=True)
    assert got.skipped_rows == bad_lines
    assert got.texts == [f"good {i}" for i in range(1, 40) if i % 3]


@pytest.mark.parametrize(
    "lines,task,reason",
    [
        (['{"text": "a", "label": "x"}', "not json"], "classify", "not JSON"),
        (['{"text": "a", "label": "x"}', '["text", "b"]'], "classify", "a JSON list, not an object"),
        (
            ['{"text": "a", "label": "x"}', '{"sentence": "b", "label": "y"}'],
            "classify",
            'no "text" string (keys: sentence, label)',
        ),
        (['{"text": "a", "label": "x"}', '{"text": "b", "label": ""}'], "classify", "empty label"),
        (['{"text": "a", "label": 1.5}', '{"text": "b", "label": "high"}'], "regress", "label 'high' is not a number"),
        (['{"text": "a", "label": 1.5}', '{"text": "b", "label": "nan"}'], "regress", "not a finite number"),
    ],
)
def test_bad_jsonl_rows(tmp_path, lines, task, reason):
    path = write(tmp_path, "data.jsonl", "\n".join(lines) + "\n")
    with pytest.raises(KbertError) as error:
        read_text_examples(path, scores=task == "regress")
    message = str(error.value)
    assert "at line 2 (line 2: " in message and reason in message
    got = read_text_examples(path, scores=task == "regress", skip_bad_rows=True)
    assert (got.texts, got.skipped_rows) == (["a"], [2])


def test_regress_label_that_is_not_a_number_in_tsv(tmp_path):
    path = write(tmp_path, "data.tsv", "text\tlabel\na\t0.5\nb\tgood\nc\t \n")
    with pytest.raises(KbertError, match=r"lines 3, 4 \(line 3: label 'good' is not a number\)"):
        read_text_examples(path, scores=True)
    got = read_text_examples(path, scores=True, skip_bad_rows=True)
    assert (got.labels, got.skipped_rows) == ([0.5], [3, 4])
    with pytest.raises(KbertError, match=r"at line 4 \(line 4: empty label\)"):
        read_text_examples(path)


def test_all_rows_bad_even_when_skipping(tmp_path):
    path = write(tmp_path, "data.tsv", "text\tlabel\nonly one column\n")
    with pytest.raises(KbertError, match=r"no usable rows \(all 1 are bad"):
        read_text_examples(path, skip_bad_rows=True)


@pytest.mark.parametrize(
    "content,message",
    [
        ("", "the file is empty"),
        ("\n  \n", "the file is empty"),
        ("text\tlabel\n", "has a header but no rows"),
        ("text\tlabel\n\n\n", "has a header but no rows"),
    ],
)
def test_empty_files(tmp_path, content, message):
    path = write(tmp_path, "data.tsv", content)
    with pytest.raises(KbertError, match=message):
        read_text_examples(path)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(KbertError, match=r"nope\.tsv: no such file"):
        read_text_examples(tmp_path / "nope.tsv")
    with pytest.raises(KbertError, match=r"nope\.conll: no such file"):
        read_tagged_examples(tmp_path / "nope.conll")
    with pytest.raises(KbertError, match="is a directory"):
        read_text_examples(tmp_path)


def test_invalid_utf8_is_replaced_and_counted(tmp_path):
    # Three invalid sequences (a Latin-1 é, a lone FF, a cut-off 3-byte sequence), and one
    # real U+FFFD that is not counted.
    raw = b"text\tlabel\n" + b"caf\xe9 \xff\tpos\n" + "ok \ufffd \u2603".encode()[:-1] + b"\tneg\n"
    got = read_text_examples(write(tmp_path, "data.tsv", raw))
    assert got.replaced_bytes == 3
    assert got.texts == ["caf\ufffd \ufffd", "ok \ufffd \ufffd"]
    conll = read_tagged_examples(write(tmp_path, "d.conll", b"caf\xe9 O\n\xff\xfe O\n"))
    assert conll.replaced_bytes == 3 and conll.words == [["caf\ufffd", "\ufffd\ufffd"]]


# === tagging ===


def test_read_conll(tmp_path):
    content = (
        "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\n\n"
        "Peter NNP B-NP B-PER\r\nBlackburn NNP I-NP I-PER"
    )  # no final newline
    got = read_tagged_examples(write(tmp_path, "train.txt", content))
    assert got.words == [["EU", "rejects"], ["Peter", "Blackburn"]]
    assert got.tags == [["B-ORG", "O"], ["B-PER", "I-PER"]]
    tabs = read_tagged_examples(write(tmp_path, "tabs.tsv", "New York\tB-LOC\nis\tO\n"))
    assert (tabs.words, tabs.tags) == ([["New York", "is"]], [["B-LOC", "O"]])


def test_conll_without_tags(tmp_path):
    path = write(tmp_path, "input.txt", "EU\nrejects\n\nPeter\n")
    got = read_tagged_examples(path, require_labels=False)
    assert (got.words, got.tags) == ([["EU", "rejects"], ["Peter"]], None)
    with pytest.raises(KbertError, match="no tag column"):
        read_tagged_examples(path)


def test_conll_bad_lines(tmp_path):
    content = "EU B-ORG\nrejects\n\nPeter B-PER\n\nA B C\nb O\n"
    path = write(tmp_path, "train.txt", content)
    with pytest.raises(KbertError) as error:
        read_tagged_examples(path)
    message = str(error.value)
    assert "lines 2, 6 (line 2: expected 2 columns like most lines, found 1)" in message
    assert message.endswith("pass skip_bad_rows=True to skip them") and str(path) in message
    got = read_tagged_examples(path, skip_bad_rows=True)
    assert (got.words, got.tags, got.skipped_rows) == ([["Peter"]], [["B-PER"]], [2, 6])
    with pytest.raises(KbertError, match="no sentences"):
        read_tagged_examples(write(tmp_path, "docstart.txt", "-DOCSTART- O\n\n"))


def test_encode_tagged_puts_each_tag_on_the_first_piece(tokenizer):
    words = [["Cassius", "crossed", "Philammon", "\x00", "road"], ["Hypatia"]]
    tags = [["B-PER", "O", "B-PER", "O", "O"], ["B-PER"]]
    label_ids = {"O": 0, "B-PER": 1, "I-PER": 2}
    features, labels, positions, truncated = encode_tagged(packer(12), words, tags, label_ids)
    # cass ##ius | crossed | phil ##am ##mon | [UNK] (a word with no tokens) | road
    assert tokenizer.convert_ids_to_tokens(features["input_ids"][0]) == [
        "[CLS]",
        "cass",
        "##ius",
        "crossed",
        "phil",
        "##am",
        "##mon",
        "[UNK]",
        "road",
        "[SEP]",
        "[PAD]",
        "[PAD]",
    ]
    assert labels[0].tolist() == [-1, 1, -1, 0, 1, -1, -1, 0, 0, -1, -1, -1]
    assert positions == [[1, 3, 4, 7, 8], [1]]
    assert tokenizer.convert_ids_to_tokens(features["input_ids"][1][:6]) == [
        "[CLS]",
        "h",
        "##yp",
        "##ati",
        "##a",
        "[SEP]",
    ]
    assert labels[1].tolist() == [-1, 1] + [-1] * 10
    assert features["input_mask"][0].tolist() == [1] * 10 + [0] * 2
    assert not features["segment_ids"].any()
    assert truncated == 0 and labels.dtype == np.int32 and labels.shape == (2, 12)


def test_encode_tagged_truncates_whole_pieces(tokenizer):
    words = [["Cassius", "crossed", "Philammon", "road"]]
    tags = [["B-PER", "O", "B-PER", "O"]]
    features, labels, positions, truncated = encode_tagged(packer(7), words, tags, {"O": 0, "B-PER": 1})
    # 5 places: cass ##ius crossed phil ##am | ##mon road cut.
    assert tokenizer.convert_ids_to_tokens(features["input_ids"][0]) == [
        "[CLS]",
        "cass",
        "##ius",
        "crossed",
        "phil",
        "##am",
        "[SEP]",
    ]
    assert labels[0].tolist() == [-1, 1, -1, 0, 1, -1, -1]
    assert positions == [[1, 3, 4, -1]] and truncated == 1
    _, none, positions, _ = encode_tagged(packer(7), words, None, {})
    assert (none == -1).all() and positions == [[1, 3, 4, -1]]


def test_unseen_tags_are_an_error():
    tags = [[f"T{i:02d}" for i in range(12, 0, -1)] + ["O"]]
    words = [["w"] * len(tags[0])]
    with pytest.raises(KbertError) as error:
        encode_tagged(packer(32), words, tags, {"O": 0})
    message = str(error.value)
    assert "tags T01, T02, T03, T04, T05, T06, T07, T08, T09, T10 and 2 more were not in the training" in message
    assert "\n" not in message


def test_module_does_not_import_tensorflow():
    code = "import sys, kbert.finetuning.readers; print('tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


SWAG_HEAD = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3"


def test_swag_csv_reads_as_the_bert_paper_pairs_it(tmp_path):
    path = tmp_path / "val.csv"
    path.write_text(
        SWAG_HEAD + ",label\n"
        '0,v,1,"A man, tired, sits. He",A man sits.,He,gold,"smiles, slowly.",runs.,flies.,sings.,0\n'
        '1,v,2,x,The dog barks.,It,gold,sleeps.,eats.,"jumps, high.",naps.,2\n'
    )
    examples = readers.read_choice_examples(path)
    assert examples.contexts == ["A man sits.", "The dog barks."]
    assert examples.endings[0] == ["He smiles, slowly.", "He runs.", "He flies.", "He sings."]
    assert examples.labels == [0, 2]
    test = tmp_path / "test.csv"
    test.write_text(SWAG_HEAD + "\n0,v,1,x,A man sits.,He,gold,a.,b.,c.,d.\n")
    assert readers.read_choice_examples(test, require_labels=False).labels is None
    with pytest.raises(KbertError, match="no label column"):
        readers.read_choice_examples(test)


@pytest.mark.parametrize(
    "content,fragment",
    [
        ("sent1,sent2,label\na,b,0\n", "needs a sent1 (or context) column and at least ending0 and ending1"),
        (SWAG_HEAD + ",label\n0,v,1,x,A.,He,gold,a.,b.,c.,d.,4\n", "label '4' is not an ending index 0..3"),
        (SWAG_HEAD + ",label\n0,v,1,x,A.,He,gold,a.,b.,c.\n", "expected 12 columns, found 10"),
    ],
)
def test_swag_csv_errors_name_the_line_and_the_fix(tmp_path, content, fragment):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(KbertError) as error:
        readers.read_choice_examples(path)
    assert fragment in str(error.value) and "\n" not in str(error.value)


def test_swag_bad_rows_can_be_skipped(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text(SWAG_HEAD + ",label\n0,v,1,x,A.,He,gold,a.,b.,c.,d.,9\n1,v,1,x,B.,It,gold,a.,b.,c.,d.,1\n")
    examples = readers.read_choice_examples(path, skip_bad_rows=True)
    assert examples.contexts == ["B."] and examples.labels == [1] and examples.skipped_rows == [2]
