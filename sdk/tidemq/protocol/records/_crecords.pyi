# The compiled twin's signatures (_crecords.pyx); each is its pure twin's (v2, v2_read).
from collections.abc import Callable
from typing import Any

def use_reader(validate_py: Callable[..., Any], read_head: Callable[..., Any],
               strict: Callable[..., None], validate_delay: Callable[..., None],
               summary: type, default_limits: object) -> None: ...
def use_writer(append_record_py: Callable[..., int]) -> None: ...
def validate(buf: bytes | bytearray | memoryview, at: int = 0, *, strict: bool = True,
             offset: int | None = None, allowed: frozenset[str] = ..., limits: Any = None,
             end: int | None = None) -> Any: ...
def append_record(buf: bytearray, ordinal: int, mid: bytes, tag: bytes, keys: bytes,
                  props: bytes, body: bytes, flag: int, reconsume: int, born: int, code: int,
                  prepared: int, delay_value: int, delay_kind: int) -> int: ...
