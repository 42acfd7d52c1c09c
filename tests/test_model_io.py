"""hpc/serving/model_io.py: the tensors a generation is asked with, per workflow, against the model configs
hpc-serve writes (names, types, shapes: what tritonserver checks before the model runs), and the llmapi model's
cumulative texts read as deltas (characters never split, a stop string cut by the engine put back, finish
reasons). Served end to end: tests/test_gateway_llmapi_cluster.py."""

from __future__ import annotations

import re

import numpy as np
import pytest
from tritonclient.grpc import service_pb2
from tritonclient.utils import serialize_byte_tensor

from backend.llmapi_repository import config_text
from hpc.serving.model_io import CumulativeText, EnsembleIO, GenerateParams, LlmapiIO, NotTaken, model_io
from launcher.contracts import model_names
from launcher.contracts.llmapi import ENGINE, IMAGE_MODEL, LLMAPI, OWN_MODEL

ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent
TRITON_TYPES = {"TYPE_STRING": "BYTES", "TYPE_BOOL": "BOOL", "TYPE_INT32": "INT32", "TYPE_FP32": "FP32"}
TRITON_TYPES |= {"TYPE_UINT64": "UINT64", "TYPE_INT64": "INT64"}
EVERYTHING = GenerateParams(
    prompt="héllo",
    max_tokens=5,
    stop=("END", "\n\n"),
    temperature=0.5,
    top_p=0.9,
    top_k=7,
    seed=3,
    presence_penalty=0.1,
    frequency_penalty=-0.2,
    repetition_penalty=1.1,
    length_penalty=0.9,
    min_tokens=2,
    ignore_eos=True,
    logprobs=True,
)


def _declared(config: str) -> dict[str, tuple[str, int]]:
    """Input name → (Triton data type, number of dims) of a config.pbtxt's `input [...]` block."""
    block = config[config.index("input [") : config.index("output [")]
    found = re.findall(r'name: "(\w+)" data_type: (TYPE_\w+) dims: \[([^\]]*)\]', block)
    return {name: (TRITON_TYPES[kind], len(dims.split(","))) for name, kind, dims in found}


def test_llmapi_requests_use_only_inputs_the_model_declares_with_their_types_and_shapes():
    config = config_text(own_inputs=True)  # hpc-serve's model: upstream's inputs and its own
    declared = _declared(config)
    assert "max_batch_size" not in config.split("#####")[-1], "no batch dimension: shapes are the dims as declared"
    for tensors in (
        LlmapiIO().tensors(EVERYTHING),
        LlmapiIO().tensors(GenerateParams("x", 1)),
        LlmapiIO().stop_tensors(),
    ):
        for tensor in tensors:
            kind, dims = declared[tensor.name()]
            assert (tensor.datatype(), len(tensor.shape())) == (kind, dims), tensor.name()
    sent = {t.name() for t in LlmapiIO().tensors(EVERYTHING)}
    assert {f"sampling_param_{n}" for n in ("temperature", "top_p", "top_k", "seed", "stop", "max_tokens")} <= sent
    assert {"streaming", "sampling_param_exclude_input_from_output", "return_finish_reason"} <= sent
    assert {t.name() for t in LlmapiIO().stop_tensors()} == {"text_input", "stop"}
    own = {f"sampling_param_{n}" for n in ("ignore_eos", "min_tokens", "repetition_penalty", "length_penalty")}
    own.add("sampling_param_logprobs")
    assert own <= sent


def test_the_images_llmapi_model_is_sent_only_what_it_takes_and_a_parameter_it_lacks_is_named():
    """NVIDIA's model.py (spec model.llmapi_model: image) declares upstream's inputs only, and fails every stop
    string (its helpers hand bytes to the tokenizer): the request is refused before it is sent, naming the field."""
    image = model_io(LLMAPI, True, IMAGE_MODEL)
    declared = _declared(config_text(own_inputs=False))
    plain = GenerateParams("x", 4, temperature=0.5, seed=1)
    assert {t.name() for t in image.tensors(plain)} <= set(declared)
    asked = (("stop", ("END",)), ("ignore_eos", True), ("min_tokens", 2), ("repetition_penalty", 1.2))
    for field, value in (*asked, ("length_penalty", 0.8), ("logprobs", True)):
        with pytest.raises(NotTaken) as refused:
            image.tensors(GenerateParams("x", 4, **{field: value}))
        assert refused.value.param == field and "llmapi_model: hpc-serve" in str(refused.value)
    # what asks for nothing (vLLM's benchmark sends repetition_penalty 1.0 always) is served, and not sent
    neutral = GenerateParams("x", 4, stop=[], min_tokens=0, repetition_penalty=1.0, length_penalty=1.0, top_k=5)
    assert {t.name() for t in image.tensors(neutral)} <= set(declared)
    assert "sampling_param_top_k" in {t.name() for t in image.tensors(neutral)}, "upstream's input: taken"
    assert model_io(LLMAPI, True, OWN_MODEL).tensors(GenerateParams("x", 4, stop=("END",)))
    assert model_io(LLMAPI, True, "").tensors(GenerateParams("x", 4, ignore_eos=True)), "an older record: ours"


def test_each_workflow_has_its_generation_model_and_an_unknown_one_is_the_engines():
    assert model_io(LLMAPI).model == model_names.TENSORRT_LLM
    assert model_io(ENGINE).model == model_names.ENSEMBLE == model_io("older-record").model
    tensors = {t.name(): t for t in EnsembleIO().tensors(EVERYTHING)}
    assert {"text_input", "max_tokens", "stream", "stop_words", "temperature", "seed"} <= set(tensors)
    assert {"min_tokens", "repetition_penalty", "length_penalty", "end_id"} <= set(tensors), "ignore_eos: end_id -1"
    assert {t.name() for t in EnsembleIO().stop_tensors()} >= {"input_ids", "stop"}


def test_an_llmapi_model_that_is_not_decoupled_is_asked_not_to_stream():
    """Upstream's model refuses `streaming` true when not decoupled; a replica's record says which it is."""
    from tritonclient.grpc import service_pb2 as pb

    def streaming(decoupled: bool) -> bool:
        (tensor,) = [t for t in model_io(LLMAPI, decoupled).tensors(EVERYTHING) if t.name() == "streaming"]
        request = pb.ModelInferRequest()
        request.raw_input_contents.append(tensor._raw_content)
        return bool(np.frombuffer(request.raw_input_contents[0], dtype=bool)[0])

    assert streaming(True) and not streaming(False)
    assert model_io(ENGINE, False) is model_io(ENGINE), "the ensemble is asked one way"


def _llmapi_response(text: str | bytes, finish: str = "None", stop_reason: str = "None", **perf: str):
    """A response as the llmapi model sends it: every output a BYTES tensor of `str(value)`."""
    response = service_pb2.ModelInferResponse(model_name="tensorrt_llm")
    named = (("text_output", text), ("finish_reason", finish), ("stop_reason", stop_reason), *perf.items())
    for name, value in named:
        raw = value if isinstance(value, bytes) else value.encode()
        response.outputs.add(name=name, datatype="BYTES", shape=[1])
        response.raw_output_contents.append(serialize_byte_tensor(np.array([raw], dtype=object)).item())
    return response


def _read(responses: list, stop: tuple[str, ...] = ()) -> list:
    decoder = CumulativeText(stop)
    chunks = [decoder.feed(r, final=i == len(responses) - 1) for i, r in enumerate(responses)]
    return [c for c in chunks if c is not None]


def test_cumulative_texts_become_deltas_and_a_cut_character_waits_for_its_end():
    euro = "€".encode()
    cut = euro[:2].decode("utf-8", errors="replace")  # what a detokenizer gives for an incomplete character
    chunks = _read(
        [
            _llmapi_response("Hi"),
            _llmapi_response("Hi " + cut),
            _llmapi_response("Hi €"),
            _llmapi_response("Hi €5"),
            _llmapi_response("Hi €5", finish="length"),
        ]
    )
    assert [c.text for c in chunks] == ["Hi", " ", "€", "5", ""]
    assert all(c.tokens is None for c in chunks), "the llmapi model counts no tokens: the caller counts the text's"
    assert [c.finish_reason for c in chunks] == [None, None, None, None, "length"]


def test_a_stop_string_the_engine_cut_is_put_back_for_the_callers_stop_rule():
    """The engine streamed "E", then ended with the text cut before "END": the caller sees "END" and cuts it,
    instead of sending "E" at the end as text that was held back."""
    from hpc.serving.text import StopStream

    chunks = _read(
        [_llmapi_response("1, 2"), _llmapi_response("1, 2 E"), _llmapi_response("1, 2 ", "stop", "END")], ("END",)
    )
    stops = StopStream(("END",))
    assert "".join(stops.feed(c.text) for c in chunks) + stops.flush() == "1, 2 "
    assert stops.stopped and chunks[-1].finish_reason == "stop"
    # a stop that is not one of the request's (the end token's id, say) is not text
    (only,) = _read([_llmapi_response("ok", "stop", "50256")], ("END",))
    assert only.text == "ok"


@pytest.mark.parametrize("text", ["None", ""])
def test_a_text_that_reads_none_is_text_and_an_empty_final_is_the_end(text):
    (chunk,) = _read([_llmapi_response(text, "stop")])
    assert chunk.text == text and chunk.finish_reason == "stop"


def test_the_perf_metrics_of_the_last_response_are_read_as_numbers():
    """The llmapi model sends them as strings (`str(value)`, upstream's dtype): KV-cache blocks and timestamps."""
    perf = {"kv_cache_reused_block": "3", "kv_cache_missed_block": "1", "kv_cache_hit_rate": "0.75"}
    first, last = _read([_llmapi_response("a"), _llmapi_response("ab", "length", **perf, arrival_time_ns="17")])
    assert first.perf is None
    assert last.perf == {"kv_cache_reused_block": 3.0, "kv_cache_missed_block": 1.0, "kv_cache_hit_rate": 0.75,
                         "arrival_time_ns": 17.0}  # fmt: skip
    (plain,) = _read([_llmapi_response("x", "stop")])
    assert plain.perf is None, "a model that sends no perf outputs has none"


def _ensemble_response(text: bytes):
    """A response as the ensemble sends it: `text_output`, the new tokens' bytes."""
    response = service_pb2.ModelInferResponse(model_name="ensemble")
    response.outputs.add(name="text_output", datatype="BYTES", shape=[1, 1])
    response.raw_output_contents.append(serialize_byte_tensor(np.array([text], dtype=object)).item())
    return response


def _empty_final():
    return service_pb2.ModelInferResponse(model_name="tensorrt_llm")


@pytest.mark.parametrize("cut", [1, 2, 3, 5])
def test_responses_read_together_give_the_text_tokens_and_finish_of_responses_read_one_by_one(cut):
    """A reader behind its replica reads the waiting responses as one chunk (hpc/serving/triton.py `_taken`):
    the joined text is what one chunk each would have given, the tokens their sum, the finish the last one's."""
    from hpc.serving.model_io import merged

    euro = "€".encode()
    llmapi = [
        _llmapi_response("Hi"),
        _llmapi_response("Hi " + euro[:2].decode("utf-8", errors="replace")),
        _llmapi_response("Hi €"),
        _llmapi_response("Hi €5", finish="length", kv_cache_reused_block="2"),
        _empty_final(),
    ]
    ensemble = [_ensemble_response(b) for b in (b"Hi", b" " + euro[:1], euro[1:], b"5")] + [_empty_final()]
    for decoder_of, responses in ((lambda: CumulativeText(()), llmapi), (lambda: EnsembleIO().decoder(GenerateParams("x", 4)), ensemble)):  # fmt: skip
        one = decoder_of()
        each = [one.feed(r, i == len(responses) - 1) for i, r in enumerate(responses)]
        together = decoder_of()
        groups = [responses[:cut], responses[cut:]]
        chunks = [together.feed_many(g, i == 1) for i, g in enumerate(groups) if g]
        alone, joined = merged(each), merged(chunks)
        assert alone is not None and joined is not None
        assert joined.text == alone.text == "Hi €5"
        assert (joined.tokens, joined.finish_reason, joined.perf) == (alone.tokens, alone.finish_reason, alone.perf)
