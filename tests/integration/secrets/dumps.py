"""Whole-database dumps, to prove no plaintext value is stored anywhere."""

import base64
import sqlite3
import subprocess

from sqlalchemy.engine import make_url


def dump_database(database_url: str) -> str:
    """`pg_dump` of a PostgreSQL database, or SQLite's `.dump` (iterdump) of the file."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        connection = sqlite3.connect(str(url.database))
        try:
            return "\n".join(connection.iterdump())
        finally:
            connection.close()
    plain = url.set(drivername="postgresql").render_as_string(hide_password=False)
    done = subprocess.run(
        ["pg_dump", f"--dbname={plain}"], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout


def plaintext_forms(value: str) -> list[str]:
    """How a value could appear in a dump if it were stored in clear: text, hex, base64."""
    raw = value.encode()
    return [value, raw.hex(), raw.hex().upper(), base64.b64encode(raw).decode()]


def leaked(dump: str, values: list[str]) -> list[str]:
    """The values found in the dump in any of those forms."""
    return [v for v in values if any(form in dump for form in plaintext_forms(v))]
