"""The protobuf messages of the Tinker API, read and written by hand (no protobuf dependency).

The SDK sends `forward_backward` bodies as `application/x-protobuf` and asks for `ForwardBackwardOutput` and
`SampleResponse` results in protobuf (it refuses them as JSON). Only the wire format is needed: varints,
fixed 64/32-bit numbers and length-delimited fields. The field numbers below are those of the SDK's public
schema (tinker 0.38.0, `tinker_public.proto`); fields this server does not use are skipped when reading.

Tensors travel as raw little-endian bytes of their dtype (`DTYPE_*`); token lists as packed int32 bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from atropos_cli.tinker.errors import invalid

DTYPE_FLOAT32, DTYPE_INT64, DTYPE_INT32, DTYPE_BFLOAT16 = 1, 2, 3, 4
_NUMPY = {DTYPE_FLOAT32: np.float32, DTYPE_INT64: np.int64, DTYPE_INT32: np.int32}
STOP_REASONS = {"stop": 0, "length": 1}

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


# -- reading ---------------------------------------------------------------------------------------------
def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise invalid("truncated protobuf varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise invalid("protobuf varint longer than 10 bytes")


def fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of one message: an int or the bytes of a LEN field."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
        elif wire == _I64:
            value, pos = int.from_bytes(buf[pos : pos + 8], "little"), pos + 8
        elif wire == _I32:
            value, pos = int.from_bytes(buf[pos : pos + 4], "little"), pos + 4
        elif wire == _LEN:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise invalid("truncated protobuf field")
            value, pos = buf[pos : pos + length], pos + length
        else:
            raise invalid(f"protobuf wire type {wire} is not supported (field {number})")
        if pos > len(buf):
            raise invalid("truncated protobuf message")
        yield number, wire, value


def _packed_ints(value: int | bytes) -> list[int]:
    if isinstance(value, int):
        return [value]
    out, pos = [], 0
    while pos < len(value):
        item, pos = _varint(value, pos)
        out.append(item)
    return out


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _as_bytes(value: int | bytes, what: str) -> bytes:
    if not isinstance(value, bytes):
        raise invalid(f"protobuf field {what} must be length-delimited")
    return value


def _text(value: int | bytes, what: str) -> str:
    try:
        return _as_bytes(value, what).decode()
    except UnicodeDecodeError:
        raise invalid(f"protobuf field {what} is not UTF-8") from None


def _map_entry(buf: bytes) -> tuple[bytes, int | bytes]:
    key: bytes = b""
    value: int | bytes = b""
    for number, _, item in fields(buf):
        if number == 1:
            key = _as_bytes(item, "map key")
        elif number == 2:
            value = item
    return key, value


def read_tensor(buf: bytes) -> np.ndarray:
    dense: bytes | None = None
    csr: dict[int, bytes] = {}
    dtype, shape = 0, list[int]()
    for number, _, value in fields(buf):
        if number == 1:
            dense = _as_bytes(value, "Tensor.dense")
        elif number == 2:
            csr = {n: _as_bytes(v, "SparseCsr") for n, _, v in fields(_as_bytes(value, "Tensor.sparse_csr"))}
        elif number == 3:
            dtype = int(value) if isinstance(value, int) else 0
        elif number == 4:
            shape.extend(_signed(v) for v in _packed_ints(value))
    np_dtype = _NUMPY.get(dtype)
    if np_dtype is None:
        raise invalid(f"tensor dtype {dtype} is not supported", hint="send float32 or int64 tensors")
    itemsize = np.dtype(np_dtype).itemsize
    if dense is None and not csr:
        dense = b""
    if dense is not None:
        if len(dense) % itemsize:
            raise invalid("tensor bytes are not a whole number of elements")
        array = np.frombuffer(dense, dtype=np_dtype).copy()
        if shape:
            if int(np.prod(shape)) != array.size:
                raise invalid(f"tensor shape {shape} does not hold its {array.size} elements")
            array = array.reshape(shape)
        return array
    if len(shape) != 2:
        raise invalid("a sparse tensor must be 2-D", hint="send it dense")
    values = np.frombuffer(csr.get(1, b""), dtype=np_dtype)
    crow = np.frombuffer(csr.get(2, b""), dtype=np.int64)
    col = np.frombuffer(csr.get(3, b""), dtype=np.int64)
    if len(crow) != shape[0] + 1 or len(col) != len(values) or (len(col) and (col.min() < 0 or col.max() >= shape[1])):
        raise invalid("sparse tensor indices do not match its shape")
    out = np.zeros(shape, dtype=np.dtype(np_dtype))
    for row in range(shape[0]):
        lo, hi = int(crow[row]), int(crow[row + 1])
        if not 0 <= lo <= hi <= len(values):
            raise invalid("sparse tensor row pointers are out of order")
        out[row, col[lo:hi]] = values[lo:hi]
    return out


@dataclass
class WireDatum:
    tokens: list[int]
    loss_fn_inputs: dict[str, np.ndarray] = field(default_factory=dict)
    has_provenance: bool = False


@dataclass
class WireForwardBackward:
    model_id: str = ""
    seq_id: int = 0
    loss_fn: str = ""
    loss_fn_config: dict[str, float | str] = field(default_factory=dict)
    forward_only: bool = False
    data: list[WireDatum] = field(default_factory=list)


def _read_chunk(buf: bytes) -> list[int]:
    for number, _, value in fields(buf):
        if number == 1:  # encoded_text
            tokens = b"".join(_as_bytes(v, "tokens") for n, _, v in fields(_as_bytes(value, "chunk")) if n == 1)
            if len(tokens) % 4:
                raise invalid("encoded_text tokens are not whole int32 values")
            return np.frombuffer(tokens, dtype=np.int32).astype(np.int64).tolist()
        if number in (2, 3):
            kind = "image" if number == 2 else "audio (dmel)"
            raise invalid(f"{kind} chunks are not supported", hint="this server trains text models: send tokens")
    return []


def _read_datum(buf: bytes) -> WireDatum:
    datum = WireDatum(tokens=[])
    for number, _, value in fields(buf):
        if number == 1:
            datum.tokens.extend(_read_chunk(_as_bytes(value, "Datum.model_input")))
        elif number == 2:
            key, tensor = _map_entry(_as_bytes(value, "loss_fn_inputs"))
            datum.loss_fn_inputs[key.decode(errors="replace")] = read_tensor(_as_bytes(tensor, "tensor"))
        elif number in (3, 4):
            datum.has_provenance = True
    return datum


def read_forward_backward(buf: bytes) -> WireForwardBackward:
    """A `ForwardBackwardRequest` body."""
    out = WireForwardBackward()
    for number, _, value in fields(buf):
        if number == 1:
            out.model_id = _text(value, "model_id")
        elif number == 2:
            out.seq_id = int(value) if isinstance(value, int) else 0
        elif number == 3:
            out.data.append(_read_datum(_as_bytes(value, "data")))
        elif number == 4:
            out.loss_fn = _text(value, "loss_fn")
        elif number == 5:  # the legacy float map; v2 (7) wins where both are set
            key, number_value = _map_entry(_as_bytes(value, "loss_fn_config"))
            if isinstance(number_value, int):
                out.loss_fn_config.setdefault(key.decode(), struct.unpack("<d", number_value.to_bytes(8, "little"))[0])
        elif number == 6:
            out.forward_only = bool(value)
        elif number == 7:
            key, entry = _map_entry(_as_bytes(value, "loss_fn_config_v2"))
            for n, _, v in fields(_as_bytes(entry, "LossConfigValue")):
                if n == 1 and isinstance(v, int):
                    out.loss_fn_config[key.decode()] = struct.unpack("<d", v.to_bytes(8, "little"))[0]
                elif n == 2:
                    out.loss_fn_config[key.decode()] = _text(v, "loss config text")
    return out


# -- writing ---------------------------------------------------------------------------------------------
def _put_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _put_varint(number << 3 | wire)


def put_len(number: int, payload: bytes) -> bytes:
    return _key(number, _LEN) + _put_varint(len(payload)) + payload


def put_varint(number: int, value: int) -> bytes:
    return _key(number, _VARINT) + _put_varint(value)


def put_double(number: int, value: float) -> bytes:
    return _key(number, _I64) + struct.pack("<d", value)


def _batched(arrays: list[np.ndarray], dtype: int) -> bytes:
    """A `BatchedTensor` of 1-D per-datum arrays: their bytes end to end, byte offsets as int64."""
    np_dtype = _NUMPY[dtype]
    parts = [np.ascontiguousarray(a, dtype=np_dtype).tobytes() for a in arrays]
    offsets = np.cumsum([0] + [len(p) for p in parts]).astype(np.int64)
    return put_len(1, b"".join(parts)) + put_len(2, offsets.tobytes()) + put_varint(3, dtype)


def write_forward_backward_output(
    outputs: list[dict[str, np.ndarray]], metrics: dict[str, float], output_type: str = "ArrayRecord"
) -> bytes:
    """A `ForwardBackwardOutput`: one ArrayRecord holding every datum's 1-D float32 outputs."""
    record = put_varint(3, len(outputs))
    names = list(outputs[0]) if outputs else []
    for name in names:
        entry = put_len(1, name.encode()) + put_len(2, _batched([o[name] for o in outputs], DTYPE_FLOAT32))
        record += put_len(2, entry)
    body = put_len(1, output_type.encode()) + (put_len(2, record) if outputs else b"")
    for key, value in metrics.items():
        body += put_len(3, put_len(1, key.encode()) + put_double(2, float(value)))
    return body


def _topk(ids: np.ndarray, logprobs: np.ndarray) -> bytes:
    n, k = ids.shape
    return (
        put_len(1, np.ascontiguousarray(ids, dtype=np.int32).tobytes())
        + put_len(2, np.ascontiguousarray(logprobs, dtype=np.float32).tobytes())
        + put_varint(3, k)
        + put_varint(4, n)
    )


@dataclass
class WireSequence:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: str
    topk: tuple[np.ndarray, np.ndarray] | None = None


def write_sample_response(
    sequences: list[WireSequence],
    prompt_logprobs: list[float] | None = None,
    topk_prompt: tuple[np.ndarray, np.ndarray] | None = None,
) -> bytes:
    """A `SampleResponse`. Prompt logprobs: one float per prompt token (the first is NaN: nothing precedes it)."""
    body = b""
    for seq in sequences:
        item = put_varint(1, STOP_REASONS[seq.stop_reason])
        item += put_len(2, np.asarray(seq.tokens, dtype=np.int32).tobytes())
        item += put_len(3, np.asarray(seq.logprobs, dtype=np.float32).tobytes())
        if seq.topk is not None:
            item += put_len(4, _topk(*seq.topk))
        body += put_len(1, item)
    if prompt_logprobs is not None:
        body += put_len(2, np.asarray(prompt_logprobs, dtype=np.float32).tobytes())
    if topk_prompt is not None:
        body += put_len(3, _topk(*topk_prompt))
    return body
