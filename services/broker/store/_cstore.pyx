# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The compiled twins of the store's per-record functions: index.py's ``write_entry``,
``write_entries`` (a batch's message ids in one call) and ``find_entries`` (the unique key of
every record, each of its keys, dedup's lookups), consume_queue.py's ``pack_units`` (a batch's
consume-queue units), without struct calls, and records/v2_copy.py's ``copy_record`` (a commit
copy written from its half's stored bytes). Same rule as ``tidemq.protocol.records._crecords``:
the common case here, anything else handed to the pure reference (bound by ``use_index``),
which raises its own error. Layout: index.py (slots u32, entries hash u32, offset i64, delta
i32, prev u32, big-endian). tests/broker/store/test_index_compiled.py compares the twins.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport (
    INT64_MAX,
    INT64_MIN,
    int32_t,
    int64_t,
    uint8_t,
    uint16_t,
    uint32_t,
    uint64_t,
)
from libc.string cimport memcmp, memcpy


from tidemq.protocol.records._bytes cimport (
    _put_i64,
    _put_u16,
    _put_u32,
    _record_crc,
    _u16,
    _u32,
    crc32,
)


cdef enum:
    SLOT_SIZE = 4
    ENTRY_SIZE = 20

cdef object _write_entry_py = None
cdef object _find_entries_py = None
cdef Py_ssize_t _header_size = 40
cdef Py_ssize_t _max_chain = 100_000


class _Reject(Exception):
    """Not the common case: the pure twin decides (and raises its own error)."""


def use_index(write_entry_py, find_entries_py, header_size, max_chain):
    """Bind index.py's references and the layout's constants."""
    global _write_entry_py, _find_entries_py, _header_size, _max_chain
    _write_entry_py, _find_entries_py = write_entry_py, find_entries_py
    _header_size, _max_chain = header_size, max_chain


cdef inline uint32_t _key_hash(object key) except? 0:
    """crc32 of the key's utf-8 (raises for a str that has no utf-8: a lone surrogate)."""
    cdef Py_ssize_t n
    cdef const char *raw = PyUnicode_AsUTF8AndSize(key, &n)
    return <uint32_t>crc32(0, <const unsigned char *>raw, <unsigned int>n)


def write_entry(mm, entries_at, slots, count, key, phys, delta):
    """``index.write_entry``, compiled."""
    cdef uint8_t[::1] mv
    cdef Py_ssize_t c_at, c_slots, c_count, slot_at, entry_at
    cdef int64_t c_phys
    cdef int32_t c_delta
    cdef uint32_t h
    cdef uint8_t *e
    try:
        if not (type(key) is str and type(entries_at) is int and type(slots) is int
                and type(count) is int and type(phys) is int and type(delta) is int):
            raise _Reject()
        c_at, c_slots, c_count, c_phys, c_delta = entries_at, slots, count, phys, delta
        if c_slots <= 0 or c_count < 0 or c_count > 0xFFFFFFFF or c_at < 0:
            raise _Reject()
        mv = mm
        h = _key_hash(key)
        slot_at = _header_size + (h % c_slots) * SLOT_SIZE
        entry_at = c_at + c_count * ENTRY_SIZE
        if slot_at + SLOT_SIZE > mv.shape[0] or entry_at + ENTRY_SIZE > mv.shape[0]:
            raise _Reject()
    except Exception:
        return _write_entry_py(mm, entries_at, slots, count, key, phys, delta)
    e = &mv[0] + entry_at
    _put_u32(e, h)
    _put_u32(e + 4, <uint32_t>((<uint64_t>c_phys) >> 32))
    _put_u32(e + 8, <uint32_t>(<uint64_t>c_phys))
    _put_u32(e + 12, <uint32_t>c_delta)
    memmove4(e + 16, &mv[0] + slot_at)  # prev: the slot's newest entry so far
    _put_u32(&mv[0] + slot_at, <uint32_t>c_count)
    return h


cdef object _write_entries_py = None


def use_entries(write_entries_py):
    """Bind index.py's reference of ``write_entries``."""
    global _write_entries_py
    _write_entries_py = write_entries_py


def write_entries(mm, entries_at, slots, first, keys, phys, delta):
    """``index.write_entries``, compiled: every argument checked and every hash computed
    before the first byte is written, so a rejected call leaves the mapping to the reference
    untouched."""
    cdef uint8_t[::1] mv
    cdef Py_ssize_t c_at, c_slots, c_first, n, i, slot_at
    cdef int64_t c_phys
    cdef int32_t c_delta
    cdef uint32_t h
    cdef uint8_t *base
    cdef uint8_t *e
    cdef list hashes
    try:
        if not (type(keys) is list and type(phys) is list and type(entries_at) is int
                and type(slots) is int and type(first) is int and type(delta) is int):
            raise _Reject()
        n = len(<list>keys)
        if len(<list>phys) != n:
            raise _Reject()
        c_at, c_slots, c_first, c_delta = entries_at, slots, first, delta
        if c_slots <= 0 or c_first < 0 or c_first + n - 1 > 0xFFFFFFFF or c_at < 0:
            raise _Reject()
        if n == 0:
            return []
        mv = mm
        if _header_size + c_slots * SLOT_SIZE > mv.shape[0] or \
                c_at + (c_first + n) * ENTRY_SIZE > mv.shape[0]:
            raise _Reject()
        hashes = []
        for i in range(n):
            key = (<list>keys)[i]
            if type(key) is not str or type((<list>phys)[i]) is not int:
                raise _Reject()
            c_phys = (<list>phys)[i]  # OverflowError beyond 64 bits: the reference raises
            hashes.append(_key_hash(key))
    except Exception:
        return _write_entries_py(mm, entries_at, slots, first, keys, phys, delta)
    base = &mv[0]
    for i in range(n):
        h = (<list>hashes)[i]
        c_phys = (<list>phys)[i]
        slot_at = _header_size + (h % c_slots) * SLOT_SIZE
        e = base + c_at + (c_first + i) * ENTRY_SIZE
        _put_u32(e, h)
        _put_u32(e + 4, <uint32_t>((<uint64_t>c_phys) >> 32))
        _put_u32(e + 8, <uint32_t>(<uint64_t>c_phys))
        _put_u32(e + 12, <uint32_t>c_delta)
        memmove4(e + 16, base + slot_at)
        _put_u32(base + slot_at, <uint32_t>(c_first + i))
    return hashes


cdef inline void memmove4(uint8_t *dst, const uint8_t *src) noexcept nogil:
    dst[0] = src[0]
    dst[1] = src[1]
    dst[2] = src[2]
    dst[3] = src[3]


def find_entries(mm, entries_at, slots, count, key, low, high):
    """``index.find_entries``, compiled."""
    cdef const uint8_t[::1] mv
    cdef Py_ssize_t c_at, c_slots, n, slot_at, steps
    cdef int64_t c_low, c_high, c_count
    cdef uint32_t h, i, prev
    cdef int32_t delta
    cdef const uint8_t *e
    try:
        if not (type(key) is str and type(entries_at) is int and type(slots) is int
                and type(count) is int and type(low) is int and type(high) is int):
            raise _Reject()
        c_at, c_slots, c_count, c_low, c_high = entries_at, slots, count, low, high
        if c_slots <= 0 or c_at < 0:
            raise _Reject()
        mv = mm
        n = mv.shape[0]
        h = _key_hash(key)
        slot_at = _header_size + (h % c_slots) * SLOT_SIZE
        if slot_at + SLOT_SIZE > n:
            raise _Reject()
        out = []
        i = _u32(&mv[0] + slot_at)
        steps = 0
        while 0 < i and i <= c_count and steps < _max_chain:
            if c_at + <Py_ssize_t>i * ENTRY_SIZE + ENTRY_SIZE > n:
                raise _Reject()
            e = &mv[0] + c_at + <Py_ssize_t>i * ENTRY_SIZE
            delta = <int32_t>_u32(e + 12)
            if _u32(e) == h and c_low <= delta <= c_high:
                out.append(<int64_t>((<uint64_t>_u32(e + 4) << 32) | _u32(e + 8)))
            prev = _u32(e + 16)
            if prev >= i:
                break  # chains only point backwards; anything else is damage
            i = prev
            steps += 1
        return out
    except Exception:
        pass
    return _find_entries_py(mm, entries_at, slots, count, key, low, high)


cdef object _pack_units_py = None


def use_units(pack_units_py):
    """Bind consume_queue.py's reference."""
    global _pack_units_py
    _pack_units_py = pack_units_py


def pack_units(base, positions, sizes, codes):
    """``consume_queue.pack_units``, compiled: 20-byte units (offset i64, size i32, tag i64)."""
    cdef Py_ssize_t n, k
    cdef int64_t c_base, phys, code
    cdef int32_t size
    cdef uint8_t *u
    try:
        if not (type(base) is int and type(positions) is list and type(sizes) is list
                and type(codes) is list):
            raise _Reject()
        n = len(positions)
        if len(sizes) != n or len(codes) != n:
            raise _Reject()
        c_base = base
        out = PyBytes_FromStringAndSize(NULL, n * ENTRY_SIZE)
        u = <uint8_t *>PyBytes_AS_STRING(out)
        for k in range(n):
            p, s, c = positions[k], sizes[k], codes[k]
            if not (type(p) is int and type(s) is int and type(c) is int):
                raise _Reject()
            phys = p
            if (phys > 0 and c_base > INT64_MAX - phys) or (phys < 0 and c_base < INT64_MIN - phys):
                raise _Reject()
            phys += c_base
            size = s
            code = c
            _put_u32(u, <uint32_t>((<uint64_t>phys) >> 32))
            _put_u32(u + 4, <uint32_t>(<uint64_t>phys))
            _put_u32(u + 8, <uint32_t>size)
            _put_u32(u + 12, <uint32_t>((<uint64_t>code) >> 32))
            _put_u32(u + 16, <uint32_t>(<uint64_t>code))
            u += ENTRY_SIZE
        return out
    except Exception:
        pass
    return _pack_units_py(base, positions, sizes, codes)


# --- record copies (records/v2_copy.py): a commit copy written from its half's stored bytes ----

cdef object _copy_record_py = None

cdef enum:
    RECORD_FIXED = 67  # a v2 record's fixed part (v2.py)
cdef Py_ssize_t MAX_U16 = 0xFFFF
cdef Py_ssize_t MAX_U32 = 0xFFFFFFFF


def use_copy(copy_record_py):
    """Bind v2_copy.py's reference."""
    global _copy_record_py
    _copy_record_py = copy_record_py


cdef inline bint _dropped(const uint8_t *name, Py_ssize_t n, tuple names):
    """Is ``name[:n]`` one of ``names`` (bytes each)?"""
    cdef bytes other
    for other in names:
        if len(other) == n and memcmp(<const char *>other, name, n) == 0:
            return True
    return False


def copy_record(buf, ordinal, src, drop_key, drop, prepared):
    """``v2_copy.copy_record``, compiled; anything unusual goes to the reference."""
    cdef const uint8_t *s
    cdef const uint8_t *k
    cdef const uint8_t *end
    cdef const uint8_t *item
    cdef const uint8_t *cut
    cdef uint8_t *r
    cdef uint8_t *w
    cdef uint16_t c_ordinal
    cdef int64_t c_prepared
    cdef Py_ssize_t n, size, id_len, tag_len, keys_len, props_len, body_len, pos, drop_len
    cdef Py_ssize_t new_keys, new_props, item_len, name_len
    cdef bint first
    cdef uint32_t code
    cdef tuple names
    try:
        if not (type(buf) is bytearray and type(src) is bytes and type(drop_key) is bytes
                and type(drop) is frozenset and type(ordinal) is int
                and type(prepared) is int):
            raise _Reject()
        names = tuple(drop)
        for other in names:
            if type(other) is not bytes:
                raise _Reject()
        c_ordinal = ordinal  # OverflowError outside u16: the reference raises struct's error
        c_prepared = prepared
        s = <const uint8_t *>(<const char *>src)
        n = len(src)
        if n < RECORD_FIXED:
            raise _Reject()
        size = _u32(s)
        id_len, tag_len, keys_len, props_len = _u16(s + 55), _u16(s + 57), _u16(s + 59), \
            _u16(s + 61)
        body_len = _u32(s + 63)
        if size != n or RECORD_FIXED + id_len + tag_len + keys_len + props_len + body_len != n:
            raise _Reject()
        mid = PyUnicode_DecodeUTF8(<const char *>s + RECORD_FIXED, id_len, NULL)
        pos = PyByteArray_GET_SIZE(buf)
        if pos > MAX_U32:
            raise _Reject()
    except Exception:
        return _copy_record_py(buf, ordinal, src, drop_key, drop, prepared)
    # room for the longest copy: a property list not ended by \x02 gains one
    PyByteArray_Resize(buf, pos + n + 1)
    r = <uint8_t *>PyByteArray_AS_STRING(buf) + pos
    w = r + RECORD_FIXED
    memcpy(w, s + RECORD_FIXED, id_len + tag_len)  # message id and tag, as stored
    w += id_len + tag_len
    # keys: each but drop_key, joined by \x1f
    k = s + RECORD_FIXED + id_len + tag_len
    end = k + keys_len
    drop_len = len(drop_key)
    first = True
    if keys_len:
        item = k
        while True:
            cut = item
            while cut < end and cut[0] != 0x1F:
                cut += 1
            item_len = cut - item
            if not (item_len == drop_len
                    and memcmp(item, <const char *>drop_key, drop_len) == 0):
                if not first:
                    w[0] = 0x1F
                    w += 1
                memcpy(w, item, item_len)
                w += item_len
                first = False
            if cut >= end:
                break
            item = cut + 1
    new_keys = w - (r + RECORD_FIXED + id_len + tag_len)
    # properties: each item (name \x01 value) whose name is not dropped, ended by \x02
    item = end
    end = item + props_len
    while item < end:
        cut = item
        while cut < end and cut[0] != 0x02:
            cut += 1
        item_len = cut - item
        if item_len:
            name_len = 0
            while name_len < item_len and item[name_len] != 0x01:
                name_len += 1
            if not _dropped(item, name_len, names):
                memcpy(w, item, item_len)
                w[item_len] = 0x02
                w += item_len + 1
        item = cut + 1
    new_props = w - (r + RECORD_FIXED + id_len + tag_len + new_keys)
    memcpy(w, end, body_len)
    w += body_len
    size = w - r
    try:
        if new_props > MAX_U16:
            raise _Reject()
        keys = PyUnicode_DecodeUTF8(<const char *>r + RECORD_FIXED + id_len + tag_len,
                                    new_keys, NULL)
    except Exception:
        PyByteArray_Resize(buf, pos)
        return _copy_record_py(buf, ordinal, src, drop_key, drop, prepared)
    PyByteArray_Resize(buf, pos + size)
    r = <uint8_t *>PyByteArray_AS_STRING(buf) + pos
    code = 0
    if tag_len:
        code = <uint32_t>crc32(0, s + RECORD_FIXED + id_len, <unsigned int>tag_len)
    _put_u32(r, <uint32_t>size)
    _put_u32(r + 4, <uint32_t>pos)
    _put_u16(r + 8, c_ordinal)
    _put_u32(r + 14, 0)  # flag
    _put_u32(r + 18, 0)  # reconsume_times
    memcpy(r + 22, s + 22, 8)  # born_timestamp
    _put_i64(r + 30, <int64_t>code + 1 if tag_len else 0)
    _put_i64(r + 38, c_prepared)
    _put_i64(r + 46, 0)  # delay_value
    r[54] = 0  # delay_kind
    _put_u16(r + 55, <uint16_t>id_len)
    _put_u16(r + 57, <uint16_t>tag_len)
    _put_u16(r + 59, <uint16_t>new_keys)
    _put_u16(r + 61, <uint16_t>new_props)
    _put_u32(r + 63, <uint32_t>body_len)
    _put_u32(r + 10, <uint32_t>_record_crc(r, size))
    return size, (<int64_t>code + 1 if tag_len else 0), mid, keys
