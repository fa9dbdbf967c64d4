"""How many messages a protobuf body holds, counted on the wire before it is decoded (pure).

Decoding builds an object per message: an empty sub-message is 2 bytes on the wire and ~70 bytes
decoded (upb), so a body's size alone does not bound what its decoding costs. `count_messages`
walks the wire format (tags and lengths only, nothing is built) and raises `TooMany` past a bound,
`TooDeep` for sub-messages nested past a depth; the schema, built from the message's descriptor,
says which fields hold messages (and repeated strings, also counted).
"""
from __future__ import annotations

from google.protobuf.descriptor import Descriptor, FieldDescriptor


class TooMany(ValueError):
    """More messages than the bound."""


class TooDeep(ValueError):
    """Sub-messages nested deeper than the bound."""


Schema = dict   # field number -> the Schema of the message it holds ({}: counted, not entered)


def schema_of(descriptor: Descriptor, _memo: dict | None = None) -> Schema:
    """Field number -> sub-schema for every message field (recursive types share their dict) and
    {} for repeated string/bytes fields (counted, not entered)."""
    memo = {} if _memo is None else _memo
    got = memo.get(descriptor.full_name)
    if got is not None:
        return got
    out: Schema = {}
    memo[descriptor.full_name] = out
    for f in descriptor.fields:
        if f.message_type is not None:
            out[f.number] = schema_of(f.message_type, memo)
        elif f.is_repeated and f.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
            out[f.number] = {}
    return out


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


def count_messages(buf: bytes, schema: Schema, limit: int, max_depth: int = 64) -> int:
    """The number of (sub-)messages and repeated strings in `buf` that `schema` names; TooMany once
    it passes `limit`, TooDeep past `max_depth` levels. A malformed body stops the count (the
    decoder then says what is wrong with it)."""
    n, pos, end, sch, stack = 0, 0, len(buf), schema, []
    try:
        while True:
            if pos >= end:
                if not stack:
                    return n
                sch, end = stack.pop()
                continue
            tag = buf[pos]
            pos += 1
            if tag >= 0x80:
                tag, pos = _varint(buf, pos - 1)
            wire = tag & 7
            if wire == 2:
                length = buf[pos]
                pos += 1
                if length >= 0x80:
                    length, pos = _varint(buf, pos - 1)
                stop = pos + length
                if stop > end:
                    return n
                sub = sch.get(tag >> 3)
                if sub is not None:
                    n += 1
                    if n > limit:
                        raise TooMany(f"more than {limit:,} messages")
                    if sub and length:
                        if len(stack) >= max_depth:
                            raise TooDeep(f"messages nested more than {max_depth} deep")
                        stack.append((sch, end))
                        sch, end = sub, stop
                        continue
                pos = stop
            elif wire == 0:
                _, pos = _varint(buf, pos)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                return n
    except IndexError:
        return n
