"""The one error type for bad input: it always names where the problem is."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input. The message names the file, the line or record id, and the field."""

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        record: str | None = None,
        field: str | None = None,
    ) -> None:
        self.message, self.file, self.line, self.record, self.field = message, file, line, record, field
        where = [
            part
            for part in (
                str(file) if file is not None else None,
                f"line {line}" if line is not None else None,
                f"id {record!r}" if record is not None else None,
                f"field {field!r}" if field is not None else None,
            )
            if part
        ]
        super().__init__(f"{': '.join([', '.join(where)] if where else [])}{': ' if where else ''}{message}")
