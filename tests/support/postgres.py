"""A private database on the machine's PostgreSQL server (localhost:5432, trust auth for user
``postgres``), created for one test and dropped afterwards: no other database is touched."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

#: The shared server: only databases this module created are ever written or dropped.
PG_DSN = "host=localhost port=5432 user=postgres"


@dataclass(frozen=True)
class PrivateDatabase:
    """One database of the shared server that belongs to the running test."""

    name: str

    @property
    def dsn(self) -> str:
        """The libpq connection string of this database (psycopg.connect takes it)."""
        return f"{PG_DSN} dbname={self.name}"

    def django_settings(self) -> str:
        """A ``DATABASES`` line for a Django settings module: this database, psycopg 3."""
        default = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": self.name,
            "USER": "postgres",
            "HOST": "localhost",
            "PORT": "5432",
        }
        return f"DATABASES = {{'default': {default!r}}}\n"


@contextmanager
def private_database(prefix: str) -> Iterator[PrivateDatabase]:
    """Create an empty database named ``<prefix>_<random>``; drop it on exit (``WITH
    (FORCE)``: sessions a killed process left open do not keep it).

    Fails the test (``pytest.fail``) when the server does not answer.
    """
    psycopg = pytest.importorskip("psycopg")
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(f"{PG_DSN} dbname=postgres", autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"PostgreSQL must answer on localhost:5432 with trust auth for user postgres: {exc}"
        )
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield PrivateDatabase(name)
        finally:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
