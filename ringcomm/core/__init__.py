"""The core every collective runs on: dtypes and ops, buffers, schedules, their executor, envelopes."""
