"""The throwaway PostgreSQL server the PostgreSQL journal's tests run against (tests/pgcluster.py)."""

from __future__ import annotations

import pg8000.native
import pytest


def test_cluster_accepts_scram_and_refuses_a_wrong_password(pg_cluster):
    con = pg8000.native.Connection(
        pg_cluster.user,
        host=pg_cluster.host,
        port=pg_cluster.port,
        password=pg_cluster.password,
        database=pg_cluster.database,
    )
    try:
        assert con.run("SELECT 1") == [[1]]
        assert con.run("SHOW password_encryption") == [["scram-sha-256"]]
    finally:
        con.close()
    with pytest.raises(pg8000.native.DatabaseError):
        pg8000.native.Connection(
            pg_cluster.user, host=pg_cluster.host, port=pg_cluster.port, password="wrong", database="postgres"
        )
