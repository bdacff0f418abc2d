-- +goose NO TRANSACTION
-- +goose Up

-- A notification whose sends fail temporarily (a 4xx reply, a refused or
-- dropped connection, a timeout) is retried for NOTIFY_RETRY_FOR (72h by
-- default), measured from its first failure, instead of a fixed number of
-- attempts: eight tries used to give up after about four minutes, so a mail
-- provider down for five lost every email due meanwhile. failing_since is
-- that first failure; `worker requeue-notifications` clears it, so a
-- requeued notification gets a whole window again. It stays set on a row
-- sent after failures, as the record of how late the email left.
--
-- A nullable column without a default is a catalog change only: no rewrite.
ALTER TABLE notifications ADD COLUMN IF NOT EXISTS failing_since timestamptz;

-- An operator requeues failed notifications, all or one order's: an index
-- of the (few) failed rows keeps that from reading the whole table. Built
-- CONCURRENTLY, outside a transaction, so that an upgrade does not block the
-- worker's writes while it builds; the DROP first clears the INVALID index a
-- failed concurrent build leaves (see 00007).
DROP INDEX CONCURRENTLY IF EXISTS notifications_failed;
CREATE INDEX CONCURRENTLY notifications_failed ON notifications (order_id) WHERE status = 'failed';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS notifications_failed;
ALTER TABLE notifications DROP COLUMN IF EXISTS failing_since;
