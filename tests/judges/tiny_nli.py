"""A tiny NLI classifier that tests build themselves: an ONNX graph, a WordLevel tokenizer, a config.json.

The graph scores "every content word of the hypothesis occurs in the premise": embedding lookups one-hot
each token (stopwords, punctuation and special tokens weigh nothing), the premise's words are max-pooled
into a presence vector, the hypothesis' words sum-pooled into counts, and ``missing = sum(counts * (1 -
presence))`` goes through a linear layer into the logits. So a hypothesis made of premise words is
entailment (about 0.93), one word not in the premise makes it "not entailment" (about 0.04), and an
out-of-vocabulary word (``[UNK]``) always counts as missing.

A dangling pronoun ("it", "they") also counts as one missing word unless the hypothesis names a referent
(a word of ``REFERENTS``) itself: like a real NLI model, "It opened in 1889." is not entailed by "The
tower opened in 1889." until the sentence before it says what "it" is.

The segment of a token comes from ``token_type_ids`` (BERT style), or, with ``token_types=False``
(RoBERTa style, no such input), from the first ``[SEP]``: every token after it is hypothesis.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, normalizers, pre_tokenizers
from tokenizers.models import WordLevel
from tokenizers.processors import TemplateProcessing

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]")
STOPWORDS = ("the", "a", "an", "is", "are", "was", "were", "be", "been", "that", "which", "of", "in", "on", "and", "to", "by", "has", "about", "at", "its",
             "for", "with", "as", "what", "here", "found", "i", ".", ",", "?", "!", ";", ":", "-")
PRONOUNS = ("it", "they", "he", "she", "this")
REFERENTS = ("tower", "eiffel", "museum", "louvre", "paris", "berlin", "team", "bridge")
CONTENT = (
    "paris", "france", "capital", "berlin", "germany", "louvre", "museum", "hosts", "eiffel", "tower",
    "opened", "built", "stands", "1889", "1887", "two", "million", "inhabitants", "bananas", "yellow",
    "fruit", "grown", "tropics", "river", "seine", "flows", "through", "bridge", "golden", "gate",
    "team", "won", "league", "title", "red", "blue", "green", "painted", "metres", "tall", "visitors",
    "year", "seven", "people", "city", "largest", "oldest", "north", "south", "east", "west", "coast",
    "river", "lake", "mountain", "forest", "island", "king", "queen", "founded", "destroyed", "rebuilt",
)
NLI_LABELS = {0: "contradiction", 1: "neutral", 2: "entailment"}
# entailment logit = 3 - 6 * missing; neutral 0; contradiction -1
_SLOPE = (0.0, 0.0, -6.0)
_BIAS = (-1.0, 0.0, 3.0)


def vocabulary(extra: Iterable[str] = ()) -> dict[str, int]:
    """Token -> id: specials first, then stopwords, pronouns and content words (each once)."""
    words = list(dict.fromkeys([*SPECIALS, *STOPWORDS, *PRONOUNS, *CONTENT, *extra]))
    return {w: i for i, w in enumerate(words)}


def build_tokenizer(vocab: Mapping[str, int]) -> Tokenizer:
    """Lowercasing WordLevel tokenizer with a BERT pair template ([CLS] A [SEP] B [SEP], B typed 1)."""
    tok = Tokenizer(WordLevel(dict(vocab), unk_token="[UNK]"))
    tok.add_special_tokens(list(SPECIALS))  # as in a real tokenizer.json: "[SEP]" in a text is the token
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    return tok


def build_graph(vocab: Mapping[str, int], *, n_outputs: int = 3, token_types: bool = True,
                slope: Sequence[float] = _SLOPE, bias: Sequence[float] = _BIAS,
                sequence: int | None = None) -> onnx.ModelProto:
    """The ONNX graph described in the module docstring; ``n_outputs`` logits per pair. ``sequence``
    fixes the inputs' sequence length (a static-shape export); ``None`` leaves it dynamic."""
    seq: str | int = "sequence" if sequence is None else sequence
    v = len(vocab)
    r = v  # one extra dimension: "an unresolved pronoun"
    dim = v + 1
    premise = np.zeros((v, dim), dtype=np.float32)
    hypothesis = np.zeros((v, dim), dtype=np.float32)
    for word, i in vocab.items():
        if word in SPECIALS[:1] or word in ("[CLS]", "[SEP]") or word in STOPWORDS:
            continue
        if word == "[UNK]":
            hypothesis[i, i] = 1.0  # never present in a premise: always missing
            continue
        if word in PRONOUNS:
            hypothesis[i, r] = 1.0
            continue
        premise[i, i] = 1.0
        hypothesis[i, i] = 1.0
        if word in REFERENTS:
            hypothesis[i, r] = -1.0
    weights = np.array([slope[:n_outputs]], dtype=np.float32)
    offsets = np.array(bias[:n_outputs], dtype=np.float32)

    inits = [
        numpy_helper.from_array(premise, "premise_embedding"),
        numpy_helper.from_array(hypothesis, "hypothesis_embedding"),
        numpy_helper.from_array(weights, "weights"),
        numpy_helper.from_array(offsets, "bias"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
        numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one"),
    ]
    if not token_types:
        inits += [
            numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero"),
            numpy_helper.from_array(np.array(vocab["[SEP]"], dtype=np.int64), "sep_id"),
            numpy_helper.from_array(np.array(1, dtype=np.int64), "axis1_scalar"),
        ]
    nodes = [
        helper.make_node("Cast", ["attention_mask"], ["am"], to=TensorProto.FLOAT),
    ]
    if token_types:
        nodes.append(helper.make_node("Cast", ["token_type_ids"], ["tt"], to=TensorProto.FLOAT))
    else:
        # hypothesis = everything after the first [SEP]
        nodes += [
            helper.make_node("Equal", ["input_ids", "sep_id"], ["is_sep"]),
            helper.make_node("Cast", ["is_sep"], ["sep_f"], to=TensorProto.FLOAT),
            helper.make_node("CumSum", ["sep_f", "axis1_scalar"], ["seps_so_far"]),
            helper.make_node("Sub", ["seps_so_far", "sep_f"], ["seps_before"]),
            helper.make_node("Greater", ["seps_before", "zero"], ["after_sep"]),
            helper.make_node("Cast", ["after_sep"], ["tt"], to=TensorProto.FLOAT),
        ]
    nodes += [
        helper.make_node("Sub", ["one", "tt"], ["not_tt"]),
        helper.make_node("Mul", ["am", "not_tt"], ["m0"]),
        helper.make_node("Mul", ["am", "tt"], ["m1"]),
        helper.make_node("Unsqueeze", ["m0", "axis2"], ["m0u"]),
        helper.make_node("Unsqueeze", ["m1", "axis2"], ["m1u"]),
        helper.make_node("Gather", ["premise_embedding", "input_ids"], ["xp"]),
        helper.make_node("Gather", ["hypothesis_embedding", "input_ids"], ["xh"]),
        helper.make_node("Mul", ["xp", "m0u"], ["xpm"]),
        helper.make_node("Mul", ["xh", "m1u"], ["xhm"]),
        helper.make_node("ReduceMax", ["xpm", "axis1"], ["present"], keepdims=0),
        helper.make_node("ReduceSum", ["xhm", "axis1"], ["counts_raw"], keepdims=0),
        helper.make_node("Relu", ["counts_raw"], ["counts"]),
        helper.make_node("Sub", ["one", "present"], ["absent"]),
        helper.make_node("Mul", ["counts", "absent"], ["missing_each"]),
        helper.make_node("ReduceSum", ["missing_each", "axis1"], ["missing"], keepdims=1),
        helper.make_node("MatMul", ["missing", "weights"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias"], ["logits"]),
    ]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", seq]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", seq]),
    ]
    if token_types:
        inputs.append(helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, ["batch", seq]))
    graph = helper.make_graph(
        nodes, "tiny_nli", inputs,
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", n_outputs])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def build_model_dir(directory: Path, *, labels: Mapping[int, str] | None = None,
                    max_position_embeddings: int = 128, token_types: bool = True,
                    model_type: str = "bert", onnx_file: bool = True, extra_words: Iterable[str] = (),
                    single_logit_slope: float = -6.0, single_logit_bias: float = 3.0,
                    tokenizer_config: Mapping[str, object] | None = None, prompt: str | None = None,
                    static_sequence: int | None = None) -> Path:
    """Write config.json, tokenizer.json and model.onnx of the tiny model into ``directory``.

    ``labels`` defaults to MNLI's three; with one label the graph has one logit (3 - 6 * missing, or
    ``single_logit_bias + single_logit_slope * missing``). ``prompt`` goes into config.json as an
    HHEM-2.1-style template (use it with ``token_types=False`` and a ``[SEP]`` between the two texts).
    """
    directory.mkdir(parents=True, exist_ok=True)
    labels = dict(NLI_LABELS if labels is None else labels)
    vocab = vocabulary(extra_words)
    build_tokenizer(vocab).save(str(directory / "tokenizer.json"))
    config = {
        "model_type": model_type,
        "architectures": ["BertForSequenceClassification"],
        "id2label": {str(k): v for k, v in labels.items()},
        "label2id": {v: k for k, v in labels.items()},
        "max_position_embeddings": max_position_embeddings,
        "vocab_size": len(vocab),
    }
    if prompt is not None:
        config["prompt"] = prompt
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    if tokenizer_config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(dict(tokenizer_config)), encoding="utf-8")
    if onnx_file:
        if len(labels) == 1:
            graph = build_graph(vocab, n_outputs=1, token_types=token_types,
                                slope=(single_logit_slope,), bias=(single_logit_bias,), sequence=static_sequence)
        else:
            n = len(labels)
            entail = next((i for i, name in labels.items() if name == "entailment"), n - 1)
            slope = [0.0] * n
            bias = [0.0] * n
            slope[entail], bias[entail] = _SLOPE[2], _BIAS[2]
            if n > 2:
                bias[0 if entail else 1] = _BIAS[0]
            graph = build_graph(vocab, n_outputs=n, token_types=token_types, slope=slope, bias=bias,
                                sequence=static_sequence)
        onnx.save(graph, str(directory / "model.onnx"))
    return directory


def build_slow_model_dir(directory: Path, *, nodes: int = 300, size: int = 1000) -> Path:
    """The tiny model's files with a graph that takes seconds: ``nodes`` chained [size x size] MatMuls.

    Its logits do not depend on the text (every pair is "neutral"); it exists to run past a deadline.
    Each node is short (tens of ms), so a run can be stopped between nodes.
    """
    build_model_dir(directory, onnx_file=False)
    inits = [
        numpy_helper.from_array(np.eye(size, dtype=np.float32), "w"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array(np.array([1, 2], dtype=np.int64), "axes12"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
        numpy_helper.from_array(np.array([1, size, size], dtype=np.int64), "shape"),
        numpy_helper.from_array(np.array([[0.0, 1.0, 0.0]], dtype=np.float32), "head"),
    ]
    nodes_ = [
        helper.make_node("Cast", ["attention_mask"], ["am"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["am", "axis1"], ["n"], keepdims=1),
        helper.make_node("Unsqueeze", ["n", "axis2"], ["n3"]),
        helper.make_node("Expand", ["n3", "shape"], ["x0"]),
    ]
    for i in range(nodes):
        nodes_.append(helper.make_node("MatMul", [f"x{i}", "w"], [f"x{i + 1}"]))
    nodes_ += [
        helper.make_node("ReduceMean", [f"x{nodes}", "axes12"], ["m"], keepdims=0),
        helper.make_node("Unsqueeze", ["m", "axis1"], ["m2"]),
        helper.make_node("MatMul", ["m2", "head"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes_, "slow_nli",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(directory / "model.onnx"))
    return directory
