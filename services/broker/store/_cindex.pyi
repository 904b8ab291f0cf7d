# The compiled twins' signatures (_cindex.pyx); each is its pure twin's (index.py).
import mmap
from collections.abc import Callable

def use_index(write_entry_py: Callable[..., None], find_entries_py: Callable[..., list[int]],
              header_size: int, max_chain: int) -> None: ...
def write_entry(mm: mmap.mmap, entries_at: int, slots: int, count: int, key: str, phys: int,
                delta: int) -> None: ...
def find_entries(mm: mmap.mmap, entries_at: int, slots: int, count: int, key: str, low: int,
                 high: int) -> list[int]: ...
