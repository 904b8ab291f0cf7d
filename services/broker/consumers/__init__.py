"""Consumers: group membership, Redis offsets, the simple consumer and receipts, retry and DLQ."""
