# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twin of the record format v2 hot paths (the pure-Python modules are the
reference and the fallback; ``_compiled`` decides which one runs).

Each function here has the name and the signature of its pure twin and gives the same result.
It checks the common case only: whatever it does not accept (any error, any unusual input) is
handed to the pure function, which raises the error the reference raises, so the errors are
the reference's by construction. The pure modules bind their twins in with ``use_*`` (this
module imports none of them: no import cycle).

Layout offsets are those of ``v2.py``; tests/sdk/protocol/records/test_compiled.py runs both
twins on the same inputs (the hypothesis fuzz included).
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy


from tidemq.protocol.records._bytes cimport (
    CRC_AT,
    CRC_FROM,
    PLACE_AT,
    _i64,
    _put_i64,
    _put_u16,
    _put_u32,
    _record_crc,
    _u16,
    _u32,
    crc32,
)


# v2 layout (v2.py): a record's fixed part (its CRC span: _bytes.pxd)
cdef enum:
    RECORD_FIXED = 67
    MAX_U16 = 0xFFFF
cdef Py_ssize_t MAX_U32 = 0xFFFFFFFF

# the pure twins and the objects they share, bound by the pure modules (use_reader, use_writer)
cdef object _validate_py = None
cdef object _read_head = None
cdef object _strict = None
cdef object _validate_delay = None
cdef object _summary = None
cdef object _default_limits = None
cdef object _is_reserved = None
cdef Py_ssize_t _tag_max = 0
cdef object _append_record_py = None


class _Reject(Exception):
    """Not the common case: the pure twin decides (and raises its own error)."""


def use_reader(validate_py, read_head, strict, validate_delay, summary, default_limits,
               is_reserved, tag_max):
    """Bind v2_read's pure functions: the fallback and the helpers ``validate`` shares."""
    global _validate_py, _read_head, _strict, _validate_delay, _summary, _default_limits
    global _is_reserved, _tag_max
    _validate_py, _read_head, _strict = validate_py, read_head, strict
    _validate_delay, _summary, _default_limits = validate_delay, summary, default_limits
    _is_reserved, _tag_max = is_reserved, tag_max


def use_writer(append_record_py):
    """Bind v2's pure ``append_record`` (the fallback of this one)."""
    global _append_record_py
    _append_record_py = append_record_py


cdef inline bint _ascii_alnum(const uint8_t *p, Py_ssize_t n) noexcept nogil:
    """All of ``p[:n]`` ASCII letters or digits (n > 0)."""
    cdef Py_ssize_t k
    cdef uint8_t c
    for k in range(n):
        c = p[k]
        if not ((48 <= c <= 57) or (65 <= c <= 90) or (97 <= c <= 122)):
            return False
    return n > 0


cdef inline bint _has_forbidden(const uint8_t *p, Py_ssize_t n) noexcept nogil:
    """A control character a name or value may not hold (\\x00 \\x01 \\x02 \\x1f): in utf-8
    these bytes are those characters and nothing else."""
    cdef Py_ssize_t k
    cdef uint8_t c
    for k in range(n):
        c = p[k]
        if c == 0 or c == 1 or c == 2 or c == 0x1F:
            return True
    return False


cdef bint _keys_ok(const uint8_t *p, Py_ssize_t n) noexcept nogil:
    """Keys joined by \\x1f, each 1-1024 bytes without control characters: what the strict
    check takes for sure (1024 bytes hold at most 1024 characters)."""
    cdef Py_ssize_t k, start = 0
    cdef uint8_t c
    for k in range(n + 1):
        c = p[k] if k < n else 0x1F
        if c == 0x1F:
            if k == start or k - start > 1024:
                return False
            start = k + 1
        elif c == 0 or c == 1 or c == 2:
            return False
    return True


cdef bint _properties_ok(const uint8_t *p, Py_ssize_t n, object allowed) except -1:
    """name \\x01 value \\x02 pairs, names non-empty, no other control characters, no
    reserved name unless ``allowed``: what the strict check takes for sure (utf-8 errors
    raise, and the reference then decides)."""
    cdef Py_ssize_t k, start = 0, sep = -1
    cdef uint8_t c
    PyUnicode_DecodeUTF8(<const char *>p, n, NULL)
    if n == 0 or p[n - 1] != 2:
        return False
    for k in range(n):
        c = p[k]
        if c == 1:
            if sep >= 0 or k == start:
                return False
            sep = k
        elif c == 2:
            if sep < 0:
                return False
            name = PyUnicode_DecodeUTF8(<const char *>(p + start), sep - start, NULL)
            if name not in allowed and _is_reserved(name):
                return False
            start, sep = k + 1, -1
        elif c == 0 or c == 0x1F:
            return False
    return True


cdef bint _strict_ok(const uint8_t *r, Py_ssize_t id_len, Py_ssize_t tag_len,
                     Py_ssize_t keys_len, Py_ssize_t props_len, int64_t body_len, int64_t code,
                     object mid, object limits, object allowed) except -1:
    """Whether the reference's strict check (``v2_read._strict``) surely passes this record;
    False: let it decide (and name the error)."""
    cdef const uint8_t *var = r + 67
    cdef const uint8_t *tag = var + id_len
    if body_len > limits.max_body_bytes or not 0 < len(mid) <= limits.max_message_id_chars:
        return False
    if _has_forbidden(var, id_len):
        return False
    if tag_len:
        if tag_len > _tag_max or not _ascii_alnum(tag, tag_len):
            return False
        if code != <int64_t>crc32(0, tag, <unsigned int>tag_len) + 1:
            return False
    elif code:
        return False
    if keys_len and not _keys_ok(tag + tag_len, keys_len):
        return False
    if props_len:
        if props_len > limits.max_properties_bytes:
            return False
        return _properties_ok(tag + tag_len + keys_len, props_len, allowed)
    return True


def validate(buf, at=0, *, strict=True, offset=None, allowed=frozenset(), limits=None,
             end=None):
    """``v2_read.validate``, compiled: the same summary, or the reference's error."""
    if limits is None:
        limits = _default_limits
    try:
        return _validate(buf, at, strict, offset, allowed, limits, end)
    except Exception:
        pass
    return _validate_py(buf, at, strict=strict, offset=offset, allowed=allowed, limits=limits,
                        end=end)


cdef object _validate(object buf, object at_obj, bint strict, object offset, object allowed,
                      object limits, object end):
    cdef const uint8_t[::1] mv = buf
    cdef Py_ssize_t n = mv.shape[0]
    cdef Py_ssize_t at = at_obj
    cdef Py_ssize_t size, p, stop, rsize, var_at, tag_at, keys_at, i, count
    cdef uint32_t pos, crc, body_len
    cdef uint16_t ordinal, id_len, tag_len, keys_len, props_len
    cdef int64_t code
    cdef uint8_t kind
    cdef int64_t payload = 0
    cdef int64_t max_body, max_id
    cdef const uint8_t *base
    cdef const uint8_t *r
    if at < 0 or n == 0:
        raise _Reject()
    head = _read_head(buf, at_obj, end)
    size = head.size
    count = head.count
    if at + size > n:
        raise _Reject()
    if offset is not None and head.base_physical != offset:
        raise _Reject()
    if strict and count > limits.max_batch_messages:
        raise _Reject()
    max_body = limits.max_body_bytes
    max_id = limits.max_message_id_chars
    positions, sizes, codes, ids, keys, delayed = [], [], [], [], [], []
    view = None
    base = &mv[0]
    p = at + head.records_at
    stop = at + size
    for i in range(count):
        if stop - p < RECORD_FIXED:
            raise _Reject()
        r = base + p
        rsize = _u32(r)
        pos = _u32(r + 4)
        ordinal = _u16(r + 8)
        crc = _u32(r + 10)
        code = _i64(r + 30)
        kind = r[54]
        id_len = _u16(r + 55)
        tag_len = _u16(r + 57)
        keys_len = _u16(r + 59)
        props_len = _u16(r + 61)
        body_len = _u32(r + 63)
        if rsize > stop - p or rsize < RECORD_FIXED:
            raise _Reject()
        if (<int64_t>RECORD_FIXED + id_len + tag_len + keys_len + props_len + body_len
                != rsize):
            raise _Reject()
        if pos != p - at or ordinal != i:
            raise _Reject()
        if _record_crc(r, rsize) != crc:
            raise _Reject()
        var_at = p + RECORD_FIXED
        tag_at = var_at + id_len
        keys_at = tag_at + tag_len
        mid = PyUnicode_DecodeUTF8(<const char *>(base + var_at), id_len, NULL)
        key = (PyUnicode_DecodeUTF8(<const char *>(base + keys_at), keys_len, NULL)
               if keys_len else "")
        if strict:
            if (tag_len or code or keys_len or props_len or body_len > max_body
                    or not 0 < len(mid) <= max_id
                    or not (_ascii_alnum(base + var_at, id_len) or mid.isalnum())) and \
                    not _strict_ok(r, id_len, tag_len, keys_len, props_len, body_len, code, mid,
                                   limits, allowed):
                if view is None:
                    view = memoryview(buf)
                _strict(view, i, tag_at, keys_at, mid, code, key, props_len, body_len, limits,
                        allowed)
            payload += body_len + props_len
        if kind:
            delayed.append(i)
        positions.append(p - at)
        sizes.append(rsize)
        codes.append(code)
        ids.append(mid)
        keys.append(key)
        p += rsize
    if p != stop:
        raise _Reject()
    if strict and payload > limits.max_batch_bytes:
        raise _Reject()
    if strict and delayed:
        for i in delayed:
            _validate_delay(buf, at + positions[i], i, limits)
    return _summary(head, positions, sizes, codes, ids, keys, delayed, payload)


def append_record(buf, ordinal, mid, tag, keys, props, body, flag, reconsume, born, code,
                  prepared, delay_value, delay_kind):
    """``v2.append_record``, compiled: the record appended to ``buf``, its size returned; what
    does not fit (or is not bytes) goes to the reference, which raises its error."""
    cdef int32_t c_flag, c_reconsume
    cdef int64_t c_born, c_code, c_prepared, c_delay
    cdef uint8_t c_kind
    cdef uint16_t c_ordinal
    cdef Py_ssize_t id_len, tag_len, keys_len, props_len, body_len, pos, size
    cdef uint8_t *r
    try:
        if not (type(buf) is bytearray and type(mid) is bytes and type(tag) is bytes
                and type(keys) is bytes and type(props) is bytes
                and (type(body) is bytes or type(body) is bytearray)):
            raise _Reject()
        if not (type(ordinal) is int and type(flag) is int and type(reconsume) is int
                and type(born) is int and type(code) is int and type(prepared) is int
                and type(delay_value) is int and type(delay_kind) is int):
            raise _Reject()  # a C conversion would take a float (struct refuses it)
        c_ordinal = ordinal
        c_flag = flag
        c_reconsume = reconsume
        c_born = born
        c_code = code
        c_prepared = prepared
        c_delay = delay_value
        c_kind = delay_kind
        id_len, tag_len, keys_len, props_len = len(mid), len(tag), len(keys), len(props)
        body_len = len(body)
        size = RECORD_FIXED + id_len + tag_len + keys_len + props_len + body_len
        if (id_len > MAX_U16 or tag_len > MAX_U16 or keys_len > MAX_U16
                or props_len > MAX_U16 or body_len > MAX_U32 or size > MAX_U32):
            raise _Reject()
    except Exception:
        return _append_record_py(buf, ordinal, mid, tag, keys, props, body, flag, reconsume,
                                 born, code, prepared, delay_value, delay_kind)
    pos = PyByteArray_GET_SIZE(buf)
    if pos > MAX_U32:
        return _append_record_py(buf, ordinal, mid, tag, keys, props, body, flag, reconsume,
                                 born, code, prepared, delay_value, delay_kind)
    PyByteArray_Resize(buf, pos + size)
    r = <uint8_t *>PyByteArray_AS_STRING(buf) + pos
    _put_u32(r, <uint32_t>size)
    _put_u32(r + 4, <uint32_t>pos)
    _put_u16(r + 8, c_ordinal)
    _put_u32(r + 14, <uint32_t>c_flag)
    _put_u32(r + 18, <uint32_t>c_reconsume)
    _put_i64(r + 22, c_born)
    _put_i64(r + 30, c_code)
    _put_i64(r + 38, c_prepared)
    _put_i64(r + 46, c_delay)
    r[54] = c_kind
    _put_u16(r + 55, <uint16_t>id_len)
    _put_u16(r + 57, <uint16_t>tag_len)
    _put_u16(r + 59, <uint16_t>keys_len)
    _put_u16(r + 61, <uint16_t>props_len)
    _put_u32(r + 63, <uint32_t>body_len)
    cdef uint8_t *w = r + RECORD_FIXED
    memcpy(w, <const char *>mid, id_len)
    w += id_len
    memcpy(w, <const char *>tag, tag_len)
    w += tag_len
    memcpy(w, <const char *>keys, keys_len)
    w += keys_len
    memcpy(w, <const char *>props, props_len)
    w += props_len
    if type(body) is bytes:
        memcpy(w, <const char *>body, body_len)
    else:
        memcpy(w, PyByteArray_AS_STRING(body), body_len)
    _put_u32(r + 10, <uint32_t>_record_crc(r, size))
    return size


# --- the stored-form decoder (stored.py) ---------------------------------------------------------

cdef object _decode_stored_py = None
cdef object _stored_message = None
cdef object _stored_read_head = None
cdef object _lazy_all = None


def use_stored(decode_stored_py, read_head, stored_message, lazy_all):
    """Bind stored.py's pure ``decode_stored`` (the fallback), ``read_head``, the message class
    and its lazy-parts value."""
    global _decode_stored_py, _stored_read_head, _stored_message, _lazy_all
    _decode_stored_py, _stored_read_head = decode_stored_py, read_head
    _stored_message, _lazy_all = stored_message, lazy_all


def decode_stored(blob, *, verify=True):
    """``stored.decode_stored``, compiled: the same messages, or the reference's error."""
    try:
        return _decode_stored(blob, verify)
    except Exception:
        pass
    return _decode_stored_py(blob, verify=verify)


cdef object _decode_stored(object blob, bint verify):
    cdef const uint8_t[::1] mv
    cdef const uint8_t *base
    cdef const uint8_t *r
    cdef Py_ssize_t n, p, h, size, a, b
    cdef uint32_t count, k
    cdef uint16_t id_len, tag_len
    cdef int64_t base_q
    if type(blob) is not bytes:
        blob = bytes(blob)  # a body is sliced from it: bytes, whatever the answer came as
    out = []
    n = len(blob)
    if n == 0:
        return out
    mv = blob
    base = &mv[0]
    cls = _stored_message
    lazy = _lazy_all
    p = 0
    while p < n:
        if n - p < 4 + 65:
            raise _Reject()
        count = _u32(base + p)
        h = p + 4
        head = _stored_read_head(blob, h, whole=False)
        p = h + head.records_at
        base_q = head.base_queue_offset
        store_ts = head.store_timestamp
        topic = head.topic
        qid = head.queue_id
        for k in range(count):
            if n - p < RECORD_FIXED:
                raise _Reject()
            r = base + p
            size = _u32(r)
            id_len = _u16(r + 55)
            tag_len = _u16(r + 57)
            if size > n - p or (<int64_t>RECORD_FIXED + id_len + tag_len + _u16(r + 59)
                                + _u16(r + 61) + _u32(r + 63) != size):
                raise _Reject()
            if verify and _record_crc(r, size) != _u32(r + 10):
                raise _Reject()
            a = p + RECORD_FIXED
            b = a + id_len
            mid = PyUnicode_DecodeUTF8(<const char *>(base + a), id_len, NULL)
            tag = (PyUnicode_DecodeUTF8(<const char *>(base + b), tag_len, NULL)
                   if tag_len else None)
            m = cls.__new__(cls)
            m._src = blob
            m._at = p
            m._lazy = lazy
            m.message_id = mid
            m.topic = topic
            m.queue_id = qid
            m.queue_offset = base_q + _u16(r + 8)
            m.tag = tag
            m.born_timestamp_ms = _i64(r + 22)
            m.store_timestamp_ms = store_ts
            m.reconsume_times = <int32_t>_u32(r + 18)
            m.receipt_handle = None
            m.state = None
            m.failure = None
            out.append(m)
            p += size
    return out
