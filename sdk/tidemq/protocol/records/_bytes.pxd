# cython: language_level=3
# Big-endian field access and the record CRC of format v2 (v2.py's layout), shared by the
# compiled twins: tidemq.protocol.records._crecords and tidemq_server.broker.store._cstore
# (both cimport it; setup.py puts sdk/ on Cython's include path).

from libc.stdint cimport int64_t, uint8_t, uint16_t, uint32_t, uint64_t


cdef extern from "zlib.h":
    unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned int length) nogil


# a v2 record's CRC covers bytes [PLACE_AT, CRC_AT) and [CRC_FROM, size)
cdef enum:
    PLACE_AT = 4
    CRC_AT = 10
    CRC_FROM = 14


cdef inline uint32_t _u32(const uint8_t *p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | p[3]


cdef inline uint16_t _u16(const uint8_t *p) noexcept nogil:
    return <uint16_t>((p[0] << 8) | p[1])


cdef inline int64_t _i64(const uint8_t *p) noexcept nogil:
    return <int64_t>((<uint64_t>_u32(p) << 32) | _u32(p + 4))


cdef inline void _put_u32(uint8_t *p, uint32_t v) noexcept nogil:
    p[0] = (v >> 24) & 0xFF
    p[1] = (v >> 16) & 0xFF
    p[2] = (v >> 8) & 0xFF
    p[3] = v & 0xFF


cdef inline void _put_u16(uint8_t *p, uint16_t v) noexcept nogil:
    p[0] = (v >> 8) & 0xFF
    p[1] = v & 0xFF


cdef inline void _put_i64(uint8_t *p, int64_t v) noexcept nogil:
    _put_u32(p, <uint32_t>((<uint64_t>v) >> 32))
    _put_u32(p + 4, <uint32_t>(<uint64_t>v))


cdef inline unsigned long _record_crc(const uint8_t *r, Py_ssize_t size) noexcept nogil:
    """A record's CRC: bytes [4, 10) then [14, size)."""
    return crc32(crc32(0, r + PLACE_AT, CRC_AT - PLACE_AT), r + CRC_FROM,
                 <unsigned int>(size - CRC_FROM))
