"""The numpy MiniLM encoder against sentence-transformers, its batching, its imports and its refusals."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, required

from trace_dspy.optimize import bert_encoder
from trace_dspy.optimize.bert_encoder import BertSentenceEncoder, UnsupportedModel, gelu, read_config
from trace_dspy.optimize.similarity import embedder_available, get_embedder, model_dir

LONG = " ".join(
    f"Day {i}: I kept thinking about the move, the boxes, my old neighbours and whether the new job will be "
    "worth leaving everything behind." for i in range(1, 16))

TEXTS = [
    "",
    "Hi",
    "ok",
    "I'm so happy for you!",
    "My dog died yesterday and I can't stop crying.",
    "I failed my driving test again.",
    "Congratulations on the new puppy!",
    "That sounds really hard. How are you holding up?",
    "I can imagine how frustrating that must be.",
    "What?!?! No way... really???",
    "Well -- I guess; maybe (not sure) [really] {at all}.",
    "   leading and trailing spaces   ",
    "Tabs\tand\nnewlines\r\nin one text",
    "ALL CAPS SHOUTING ABOUT THE EXAM",
    "Café, naïve, résumé, über, façade",
    "Привет, как дела? Я очень устал.",
    "我今天很难过，因为考试没有通过。",
    "今日はとても嬉しいです！",
    "Emoji time 😀😢🎉 and a heart ❤️",
    "Numbers: 3.14159, 42, 1,000,000 and 2024-05-01.",
    "email me at someone@example.com or visit http://example.org/path?q=1",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "I got a promotion at work today, and my boss said I earned it after all those late nights.",
    "My sister forgot my birthday again; I feel like nobody in my family cares about me anymore.",
    "The storm knocked out our power for three days and we lost all the food in the freezer.",
    "I am nervous about the surgery next week, but the doctors say it should go fine.",
    "We finally paid off the mortgage! Twenty years of payments and it is done.",
    "\u200bzero width space and \u00a0non-breaking space",
    LONG,
    LONG + " and then a different ending that truncation cuts off entirely.",
]


@pytest.fixture(scope="module")
def folder() -> Path:
    path = model_dir()
    if path is None or not embedder_available():
        required("the 'embed' extra is not installed")
    return path


@pytest.fixture(scope="module")
def encoder(folder) -> BertSentenceEncoder:
    return BertSentenceEncoder(folder)


@pytest.fixture(scope="module")
def vectors(encoder) -> np.ndarray:
    return encoder.encode(TEXTS)


def test_the_config_comes_from_the_folder(folder, encoder):
    config = json.loads((folder / "config.json").read_text())
    assert encoder.dim == config["hidden_size"] == 384
    assert len(encoder.layers) == config["num_hidden_layers"]
    assert encoder.config.num_heads == config["num_attention_heads"]
    assert encoder.config.max_seq_length == json.loads((folder / "sentence_bert_config.json").read_text())[
        "max_seq_length"] == 256


def test_the_long_texts_are_truncated(folder, encoder):
    from tokenizers import Tokenizer

    untruncated = Tokenizer.from_file(str(folder / "tokenizer.json"))
    untruncated.no_truncation()
    assert len(untruncated.encode(LONG).ids) > encoder.config.max_seq_length + 100
    assert [len(ids) for ids, _ in encoder.tokenize(TEXTS[-2:])] == [encoder.config.max_seq_length] * 2
    ids = encoder.tokenize(["", "Hi"])
    assert ids[0][0] == [101, 102] and len(ids[1][0]) == 3  # [CLS] [SEP] around what there is


def test_the_vectors_are_sentence_transformers_vectors(folder, vectors):
    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(str(folder), device="cpu").encode(
        TEXTS, batch_size=64, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False)
    ours = vectors
    assert ours.dtype == np.float32 and ours.shape == reference.shape == (len(TEXTS), 384)
    assert np.abs(ours - reference).max() < 1e-5
    cosine = np.sum(ours * reference, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() > 0.99999
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)


def test_a_texts_vector_does_not_depend_on_its_batch(encoder, vectors, monkeypatch):
    for text in ("I failed my driving test again.", "", "Café 😀"):
        alone = encoder.encode([text])[0]
        beside_a_long_one = encoder.encode([LONG, text, "Hi"])[1]  # padded to 256 tokens there
        assert np.abs(alone - beside_a_long_one).max() < 1e-6
    # Batches of at most three rows, each padded to its own longest text: the same vectors.
    monkeypatch.setattr(bert_encoder, "MAX_BATCH", 3)
    assert np.abs(encoder.encode(TEXTS) - vectors).max() < 1e-6


def test_the_embedder_keeps_its_api(folder):
    embedder = get_embedder()
    assert embedder is get_embedder()
    vectors = embedder.encode(["a sad day", "a sad day", "a happy day"])
    assert vectors.dtype == np.float32 and vectors.shape == (3, 384)
    assert np.array_equal(vectors[0], vectors[1])
    assert embedder.encode([]).shape == (0, 384)
    assert 0.0 <= embedder.similarity("a sad day", "a happy day") < embedder.similarity("a sad day", "a sad day")
    assert embedder.similarity("a sad day", "a sad day") == pytest.approx(1.0, abs=1e-6)


def test_encoding_imports_no_torch(folder):
    script = (
        "import json, sys\n"
        "import trace_dspy\n"
        "from trace_dspy.optimize import similarity\n"
        "from trace_dspy.program.emotion_prior import default_encoder\n"
        "vectors = default_encoder()(['I lost my keys.', 'Hi'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', "
        "'sentence_transformers'))\n"
        "print(json.dumps({'file': similarity.__file__, 'shape': list(vectors.shape), 'heavy': heavy}))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, check=False,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert Path(out["file"]).resolve().is_relative_to(REPO.resolve())
    assert out["shape"] == [2, 384]
    assert out["heavy"] == []


def test_gelu_is_the_erf_gelu():
    x = np.linspace(-12, 12, 4001, dtype=np.float32)
    exact = np.array([0.5 * float(v) * math.erfc(-float(v) / math.sqrt(2)) for v in x])
    got = gelu(x)
    assert got.dtype == np.float32
    assert np.all(np.abs(got - exact) <= 2e-7 * np.maximum(np.abs(exact), 1e-30) + 1e-30)


def _copy(folder: Path, tmp_path: Path) -> Path:
    """A folder of the model's configs, its big files linked rather than copied."""
    copy = tmp_path / "model"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("model.safetensors", "tokenizer.json"))
    for name in ("model.safetensors", "tokenizer.json"):
        (copy / name).symlink_to(folder / name)
    return copy


def _edit(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(("file", "changes", "message"), [
    ("config.json", {"model_type": "roberta"}, "model_type 'roberta'; only BERT"),
    ("config.json", {"hidden_act": "silu"}, "hidden_act 'silu'"),
    ("config.json", {"position_embedding_type": "relative_key"}, "position_embedding_type 'relative_key'"),
    ("config.json", {"num_attention_heads": 5}, "not a multiple of num_attention_heads"),
    ("1_Pooling/config.json", {"pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True},
     "only pooling_mode_mean_tokens"),
    ("sentence_bert_config.json", {"max_seq_length": 1024}, "max_seq_length 1024"),
])
def test_an_unsupported_folder_is_refused(folder, tmp_path, file, changes, message):
    copy = _copy(folder, tmp_path)
    _edit(copy / file, **changes)
    with pytest.raises(UnsupportedModel, match="unsupported model folder .*" + message.replace("(", r"\(")):
        BertSentenceEncoder(copy)


def test_other_modules_and_missing_files_are_refused(folder, tmp_path):
    copy = _copy(folder, tmp_path)
    modules = json.loads((copy / "modules.json").read_text())
    (copy / "modules.json").write_text(json.dumps(
        [*modules, {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(UnsupportedModel, match="sentence_transformers.models.Dense"):
        read_config(copy)
    (copy / "modules.json").write_text(json.dumps(modules))
    (copy / "model.safetensors").unlink()
    with pytest.raises(UnsupportedModel, match="no model.safetensors"):
        BertSentenceEncoder(copy)
    with pytest.raises(UnsupportedModel, match="no modules.json"):
        BertSentenceEncoder(tmp_path)
