"""An order saga on agboss-sql: reserve stock, charge in the fence's transaction, ship each
item as a child workflow on any worker, wait for an approval, refund on cancel."""
