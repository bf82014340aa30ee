"""`python -m agboss_sql.cli`: the `agboss-sql` command (what the cluster starts its
workers with)."""

from agboss_sql.cli import main

raise SystemExit(main())
