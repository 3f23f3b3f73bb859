"""The PostgreSQL the tests use: ``IDOLCAST_TEST_PG_DSN``, else the role and database that
``make sysdeps`` / ``.ci/run`` create on 127.0.0.1. Each test gets its own schema."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import pytest

DEFAULT_DSN = "postgresql://idolcast:idolcast@127.0.0.1:5432/idolcast_test"


def base_dsn() -> str:
    return os.environ.get("IDOLCAST_TEST_PG_DSN", DEFAULT_DSN)


@contextmanager
def fresh_schema() -> Iterator[str]:
    """A DSN whose search_path is a new, empty schema (dropped afterwards); skips where no
    PostgreSQL answers, saying which DSN was tried."""
    psycopg = pytest.importorskip(
        "psycopg", reason="psycopg is not installed (pip install 'psycopg[binary]')"
    )
    dsn = base_dsn()
    try:
        admin = psycopg.connect(dsn, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:
        pytest.skip(f"no PostgreSQL at {dsn} ({str(e).strip().splitlines()[0]}); run `make sysdeps` as root")
    schema = f"t_{uuid.uuid4().hex[:10]}"
    admin.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in dsn else "?"
    try:
        yield f"{dsn}{sep}options={quote(f'-csearch_path={schema}')}"
    finally:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")
        admin.close()
