-- +goose NO TRANSACTION
-- +goose Up

-- The reconciler's orphan sweep looks for orders that made a second create
-- attempt (maintenance.sweepCandidates). Before, it read every paid order
-- with a PaymentIntent and probed its attempts, each round (every 10s): a
-- parallel scan of the whole orders table that grew with the shop's
-- history. This index holds only the create attempts after the first,
-- which only an indeterminate or unanswered create leads to, so the sweep
-- reads what it may act on.
--
-- Its columns and predicate never change after the insert, so it keeps
-- every update of payment_attempts on the checkout's path a HOT update
-- (an index on outcome would not: PostgreSQL skips HOT when any indexed or
-- predicate column changes, src/backend/access/heap/README.HOT), and the
-- checkout's own first attempts never enter it. CONCURRENTLY, outside a
-- transaction, so that an upgrade does not block checkouts while it builds.
--
-- A concurrent build that fails (a deadlock, a canceled statement, the
-- process killed) leaves an INVALID index of that name behind, which no
-- query uses and which IF NOT EXISTS would then keep for good; goose records
-- the migration only once it has run to the end, so it runs again on the
-- next start, and the DROP first clears what a failed run left
-- (https://www.postgresql.org/docs/15/sql-createindex.html#SQL-CREATEINDEX-CONCURRENTLY).
DROP INDEX CONCURRENTLY IF EXISTS payment_attempts_recreated;
CREATE INDEX CONCURRENTLY payment_attempts_recreated
    ON payment_attempts (created_at) WHERE step = 'create' AND attempt > 1;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS payment_attempts_recreated;
