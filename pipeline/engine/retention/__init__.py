"""Retention: deleting a store's old files as RocketMQ 4.9.x's broker does, and the disk-full
mark. :mod:`.service` runs the rounds (RocketMQ's three cleaners as one call), :mod:`.policy`
says when and why (thresholds, triggers, reasons, the disk's measure), :mod:`.report` what a
round did or would do. What a round deletes, for operators: docs/operations.md ("Retention")."""
