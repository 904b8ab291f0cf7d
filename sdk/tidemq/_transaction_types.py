"""What a transactional send is and answers: the state of a local transaction and the send's
result (``TransactionProducer``, ``_transaction.py``; ``LocalTransactionError`` carries one).

Kept apart from the producer so that the exceptions and the outbox can name them without
importing the producer and everything it imports.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tidemq._exceptions import TidemqError


class TransactionState(StrEnum):
    """What a local transaction did; also the action sent to the broker."""

    COMMIT = "commit"  # deliver the message
    ROLLBACK = "rollback"  # never deliver it
    UNKNOWN = "unknown"  # not known yet: the broker will check again later


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    message_id: str
    transaction_id: str
    topic: str
    local_state: TransactionState  # what execute_local_transaction answered
    broker: str  # the broker holding the transaction
    # what execute_local_transaction raised; set only on the result a LocalTransactionError
    # carries (a returned result never has one)
    error: BaseException | None = None
    end_error: TidemqError | None = None  # the end did not reach the broker (a check will)
    broker_name: str | None = None  # the group holding it: what cancel_delayed asks first
