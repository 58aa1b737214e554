"""What a classifier directory holds and how its outputs read: files, label mapping, input window.

Pure file reading (JSON), no inference library: the ``model`` judge validates a local directory here when
it is built, so a wrong path or an unusable label set is a configuration error at startup, not a failure at
the first answer.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

ScoreMode = Literal["softmax", "sigmoid", "sigmoid_inverted"]

# the label that means "the premise supports the hypothesis": NLI entailment first, then the names
# hallucination detectors use for their positive class
_ENTAIL = re.compile(r"entail", re.IGNORECASE)
_CONSISTENT = re.compile(r"consisten|support|factual|faithful|grounded|correct", re.IGNORECASE)
# "not_entailment", "non-entailment", "inconsistent", "unsupported", "no support"
_NEGATED = re.compile(r"(?:^|[\s_\-])(?:not|non|no)(?:[\s_\-]|$)|^(?:non|un|in)(?=[a-z])", re.IGNORECASE)
# a single-output model whose one label names the bad class: its sigmoid is the hallucination probability
_BAD = re.compile(r"hallucinat|inconsisten|unsupport|contradict", re.IGNORECASE)
# position embeddings the RoBERTa family reserves (padding offset) beyond its usable input length
_OFFSET_MODELS = frozenset({"roberta", "xlm-roberta", "camembert", "longformer", "mpnet"})
_DEFAULT_MAX_LENGTH = 512
_SANE_MAX_LENGTH = 100_000  # tokenizer_config.json says 1e30 when it does not know
ONNX_CANDIDATES = ("model.onnx", "onnx/model.onnx")


class ModelFileError(Exception):
    """The model directory cannot be used; the message says what is missing or wrong."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A classifier as read from its directory: where its files are and how to turn logits into a score.

    ``positive`` is the output column of the supporting label; ``mode`` says how its score is computed
    (``softmax`` over all columns, ``sigmoid`` of a single logit, or one minus it when the single label
    names the hallucinated class). ``max_length`` is the pair's token window. ``prompt`` is the template of
    models that read one text rather than a pair (HHEM-2.1's ``config.json`` ``prompt``, with ``{text1}``
    for the premise and ``{text2}`` for the hypothesis).
    """

    directory: Path
    tokenizer_file: Path
    onnx_file: Path | None
    labels: tuple[str, ...]
    positive: int
    mode: ScoreMode
    max_length: int
    model_type: str
    prompt: str | None = None

    @property
    def label(self) -> str:
        """The name of the supporting label (what a score is the probability of)."""
        return self.labels[self.positive] if self.labels else "consistent"


def read_spec(directory: Path, *, max_length: int = 0) -> ModelSpec:
    """Read ``config.json`` (+ ``tokenizer_config.json``) of ``directory``; raise :class:`ModelFileError`.

    ``max_length`` > 0 caps the window below what the model allows (never above: a longer input than its
    position embeddings would fail inside the model).
    """
    if not directory.is_dir():
        raise ModelFileError(f"model directory {str(directory)!r} does not exist")
    config_path = directory / "config.json"
    tokenizer_file = directory / "tokenizer.json"
    missing = [p.name for p in (config_path, tokenizer_file) if not p.is_file()]
    if missing:
        raise ModelFileError(
            f"model directory {str(directory)!r} has no {' or '.join(missing)} (a model directory needs "
            "config.json, tokenizer.json and model.onnx, e.g. from `optimum-cli export onnx "
            "--task text-classification`; transformers' AutoTokenizer.save_pretrained writes tokenizer.json)"
        )
    config = _json(config_path)
    labels = _labels(config, config_path)
    positive, mode = _positive(labels, config, config_path)
    onnx_file = next((directory / c for c in ONNX_CANDIDATES if (directory / c).is_file()), None)
    model_type = str(config.get("model_type") or "")
    prompt = config.get("prompt")
    if prompt is not None and not (isinstance(prompt, str) and "{text1}" in prompt and "{text2}" in prompt):
        raise ModelFileError(
            f"{str(config_path)!r}: 'prompt' must be a template holding {{text1}} (the premise) and "
            f"{{text2}} (the hypothesis), got {prompt!r}"
        )
    return ModelSpec(
        directory=directory,
        tokenizer_file=tokenizer_file,
        onnx_file=onnx_file,
        labels=labels,
        positive=positive,
        mode=mode,
        max_length=_max_length(directory, config, model_type, max_length),
        model_type=model_type,
        prompt=prompt,
    )


def _json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ModelFileError(f"{str(path)!r} is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"{str(path)!r} does not hold a JSON object")
    return data


def _labels(config: dict[str, Any], path: Path) -> tuple[str, ...]:
    raw = config.get("id2label")
    if raw is None:
        n = config.get("num_labels")
        return tuple(f"LABEL_{i}" for i in range(n)) if isinstance(n, int) and n > 0 else ()
    if not isinstance(raw, dict) or not raw:
        raise ModelFileError(f"{str(path)!r}: id2label must be an object of index -> label name")
    try:
        by_index = {int(k): str(v) for k, v in raw.items()}
    except ValueError:
        raise ModelFileError(f"{str(path)!r}: id2label keys must be integers, got {sorted(raw)!r}") from None
    if sorted(by_index) != list(range(len(by_index))):
        raise ModelFileError(f"{str(path)!r}: id2label indexes must be 0..n-1, got {sorted(by_index)!r}")
    return tuple(by_index[i] for i in range(len(by_index)))


def _positive(labels: tuple[str, ...], config: dict[str, Any], path: Path) -> tuple[int, ScoreMode]:
    for pattern in (_ENTAIL, _CONSISTENT):
        for i, name in enumerate(labels):
            if pattern.search(name) and not _NEGATED.search(name):
                return i, ("softmax" if len(labels) > 1 else "sigmoid")
    if len(labels) <= 1:
        # HHEM-style: one logit, its sigmoid is the consistency score (or the hallucination probability
        # when the one label says so)
        if labels and _BAD.search(labels[0]):
            return 0, "sigmoid_inverted"
        return 0, "sigmoid"
    raise ModelFileError(
        f"{str(path)!r}: none of the labels {list(labels)!r} means entailment (a name matching 'entail') "
        "or consistency ('consistent', 'supported', 'factual'); the model judge needs to know which output "
        "says the context supports the claim. Name the labels in config.json's id2label (an HHEM-2.1 export: "
        '{"0": "hallucinated", "1": "consistent"})'
    )


def _max_length(directory: Path, config: dict[str, Any], model_type: str, cap: int) -> int:
    limits: list[int] = []
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and positions > 0:
        limits.append(positions - 2 if model_type in _OFFSET_MODELS else positions)
    tokenizer_config = directory / "tokenizer_config.json"
    if tokenizer_config.is_file():
        value = _json(tokenizer_config).get("model_max_length")
        if isinstance(value, int | float) and math.isfinite(value) and 0 < value < _SANE_MAX_LENGTH:
            limits.append(int(value))
    if cap > 0:
        limits.append(cap)
    return min(limits) if limits else _DEFAULT_MAX_LENGTH


# what a snapshot fetches: config and tokenizer files, and the weights of the backend that will run them
_HUB_FILES = ["*.json", "*.txt", "*.model"]
_HUB_ONNX = [*ONNX_CANDIDATES]
_HUB_TORCH = ["*.safetensors", "pytorch_model.bin"]


def resolve_directory(path_or_id: str, backend: str = "auto") -> Path:
    """A local directory as it is; anything else is a hub model id fetched with ``snapshot_download``.

    huggingface_hub is imported only here, and only for an id: a machine without it (or without a network)
    can still use a local directory. The ONNX graph is fetched for ``onnx``/``auto``, the PyTorch weights
    for ``torch`` (and for ``auto`` when the repository has no ONNX graph).
    """
    local = Path(path_or_id).expanduser()
    if local.exists() or path_or_id.startswith((".", "/", "~")) or path_or_id.count("/") > 1:
        return local
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ModelFileError(
            f"{path_or_id!r} is not a local directory, and fetching it as a model id needs huggingface_hub "
            "(pip install huggingface_hub), or download the model and set STREAMJUDGE_MODEL_PATH to its "
            "directory"
        ) from None
    try:
        patterns = _HUB_FILES + (_HUB_TORCH if backend == "torch" else _HUB_ONNX)
        fetched = Path(snapshot_download(repo_id=path_or_id, allow_patterns=patterns))
        if backend == "auto" and not any((fetched / c).is_file() for c in ONNX_CANDIDATES):
            fetched = Path(snapshot_download(repo_id=path_or_id, allow_patterns=_HUB_FILES + _HUB_TORCH))
    except Exception as exc:  # network, auth, unknown repo: all mean "use a local directory"
        raise ModelFileError(
            f"cannot fetch model {path_or_id!r} ({type(exc).__name__}: {exc}); set STREAMJUDGE_MODEL_PATH "
            "to a local model directory"
        ) from None
    return fetched
