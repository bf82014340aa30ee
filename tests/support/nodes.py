"""Instances on different servers of one database: `AGBOSS_TEST_DATABASE_URLS`.

On a multi-primary cluster (Galera) the same database is reached through each node. When
`AGBOSS_TEST_DATABASE_URLS` names them (whitespace-separated, `AGBOSS_TEST_DATABASE_URL`
being one of them), the suites that open one connection per instance spread their
instances over the nodes, round robin; unset, every instance uses the one URL.
"""

from __future__ import annotations

import os

DATABASE_URLS_ENV = "AGBOSS_TEST_DATABASE_URLS"


def node_url(url: str, index: int) -> str:
    """The URL the `index`-th instance connects to: the `index`-th node (round robin) when
    `AGBOSS_TEST_DATABASE_URLS` is set, else `url`."""
    urls = os.environ.get(DATABASE_URLS_ENV, "").split()
    return urls[index % len(urls)] if urls else url
